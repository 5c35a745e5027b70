"""Entry point of every Bazel py_test: runs pytest on the files given as arguments.

pytest's exit code passes through, so "no tests collected" (5) fails the Bazel test too.
"""

import os
import sys

import pytest

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    args = [os.path.join(root, a) if not os.path.isabs(a) and not a.startswith("-") else a for a in sys.argv[1:]]
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", root] + args))
