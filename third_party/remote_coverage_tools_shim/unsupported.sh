#!/bin/sh
echo "coverage unsupported in the offline build" >&2
exit 1
