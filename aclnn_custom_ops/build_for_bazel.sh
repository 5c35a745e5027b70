#!/usr/bin/env bash
# Builds the CANN custom-operator package for Bazel.
#
#   build_for_bazel.sh OUT_DIR 'op1;op2' SOC
#
# Finds CANN (ASCEND_HOME_PATH, then ASCEND_OPP_PATH's toolkit, then the default install path),
# sources its environment, checks for bisheng and cmake, configures and builds this project with
# CANN's CMake flow for the listed operators and SOC (e.g. ascend910b), and collects into OUT_DIR:
#   lib/libcust_opapi.so  lib/libcust_opsproto_rt2.0.so  lib/libcust_opmaster_rt2.0.so
#   opp.tar  (the installed vendors/<vendor> package; point ASCEND_CUSTOM_OPP_PATH at it once unpacked)
set -euo pipefail

die() {
  echo "build_for_bazel.sh: $*" >&2
  exit 1
}

[ $# -eq 3 ] || die "usage: build_for_bazel.sh OUT_DIR 'op1;op2' SOC"
OUT_DIR=$1
OPS=$2
SOC=$3
PROJECT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEFAULT_CANN=/usr/local/Ascend/ascend-toolkit/latest
VENDOR=${ASCEND_VENDOR_NAME:-customize}

# 1. CANN
tried=()
CANN=""
if [ -n "${ASCEND_HOME_PATH:-}" ]; then
  tried+=("ASCEND_HOME_PATH=${ASCEND_HOME_PATH}")
  [ -d "${ASCEND_HOME_PATH}" ] && CANN=${ASCEND_HOME_PATH}
fi
if [ -z "$CANN" ] && [ -n "${ASCEND_OPP_PATH:-}" ]; then
  tried+=("ASCEND_OPP_PATH=${ASCEND_OPP_PATH} (its parent)")
  candidate=$(dirname "${ASCEND_OPP_PATH}")
  [ -d "$candidate" ] && CANN=$candidate
fi
if [ -z "$CANN" ]; then
  tried+=("${DEFAULT_CANN}")
  [ -d "${DEFAULT_CANN}" ] && CANN=${DEFAULT_CANN}
fi
[ -n "$CANN" ] || die "CANN not found (tried: ${tried[*]}). Install the CANN toolkit, or set ASCEND_HOME_PATH."
echo "build_for_bazel.sh: CANN at ${CANN}"

# 2. its environment
if [ -f "${CANN}/set_env.sh" ]; then
  # shellcheck disable=SC1091
  source "${CANN}/set_env.sh"
elif [ -f "${CANN}/bin/setenv.bash" ]; then
  # shellcheck disable=SC1091
  source "${CANN}/bin/setenv.bash"
else
  die "${CANN} has no set_env.sh (or bin/setenv.bash): is it a CANN toolkit install?"
fi

# 3. tools
BISHENG=${CANN}/compiler/ccec_compiler/bin/bisheng
if [ ! -x "$BISHENG" ]; then
  BISHENG=$(command -v bisheng || true)
fi
if [ -z "$BISHENG" ] || [ ! -x "$BISHENG" ]; then
  die "bisheng (the AscendC kernel compiler) not found in ${CANN}/compiler/ccec_compiler/bin or on PATH"
fi
command -v cmake >/dev/null || die "cmake not found (CANN's operator build needs CMake >= 3.16)"

# 4. operators
IFS=';' read -r -a op_list <<<"$OPS"
[ ${#op_list[@]} -gt 0 ] || die "no operators given"
for op in "${op_list[@]}"; do
  if [ ! -d "${PROJECT_DIR}/${op}/op_host" ] || [ ! -d "${PROJECT_DIR}/${op}/op_kernel" ]; then
    die "operator '${op}' has no ${op}/op_host and ${op}/op_kernel folders in ${PROJECT_DIR}"
  fi
done

# 5. configure, build, install
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
BUILD_DIR=${OUT_DIR}/build
INSTALL_DIR=${OUT_DIR}/install
mkdir -p "$BUILD_DIR" "$INSTALL_DIR"
cmake -S "$PROJECT_DIR" -B "$BUILD_DIR" \
  -DASCEND_CANN_PACKAGE_PATH="$CANN" \
  -DASCEND_COMPUTE_UNIT="$SOC" \
  -DASCEND_OPS="$OPS" \
  -DBISHENG="$BISHENG" \
  -Dvendor_name="$VENDOR" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$INSTALL_DIR"
cmake --build "$BUILD_DIR" -j "$(nproc)"
cmake --install "$BUILD_DIR"

# 6. collect
mkdir -p "${OUT_DIR}/lib"
for lib in libcust_opapi.so libcust_opsproto_rt2.0.so libcust_opmaster_rt2.0.so; do
  found=$(find "$INSTALL_DIR" "$BUILD_DIR" -name "$lib" -type f -print -quit 2>/dev/null || true)
  [ -n "$found" ] || die "the build produced no ${lib}"
  cp -f "$found" "${OUT_DIR}/lib/${lib}"
done
PACKAGE=${INSTALL_DIR}/vendors/${VENDOR}
[ -d "$PACKAGE" ] || die "the build installed no operator package at ${PACKAGE}"
tar -C "${INSTALL_DIR}/vendors" -cf "${OUT_DIR}/opp.tar" "$VENDOR"
echo "build_for_bazel.sh: ${OPS} for ${SOC} -> ${OUT_DIR}/lib and ${OUT_DIR}/opp.tar"
