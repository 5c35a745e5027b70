#!/usr/bin/env bash
# Builds the CANN custom-operator package for Bazel, through CANN's own op-package flow.
#
#   build_for_bazel.sh OUT_DIR 'op1;op2' 'soc1;soc2'
#
# 1. finds CANN (ASCEND_HOME_PATH, ASCEND_TOOLKIT_PATH, ASCEND_OPP_PATH's toolkit, then the default install paths:
#    root's /usr/local/Ascend and a user's $HOME/Ascend) and sources its environment; checks for msopgen, bisheng,
#    cmake and python3 (the one CANN's set_env.sh puts first on PATH, not necessarily /usr/bin's);
# 2. `msopgen gen` lays out the op-package project (CMakeLists.txt, CMakePresets.json, build.sh, cmake/,
#    op_host/, op_kernel/, scripts/) from the operators' <op>/<op>.json descriptions;
# 3. this project's op_host / op_kernel sources replace the generated stubs, CMakePresets.json's values
#    are merged in (with the CANN path, every SOC and vendor), and host code is compiled as C++17 (CANN's
#    opbase headers need it; the template says -std=c++11);
# 4. the project's build.sh runs op_build (the aclnn wrapper, op proto and ops-info generated from OpDef),
#    compiles one kernel per tiling key and packs custom_opp_<os>_<arch>.run, which is installed here;
# 5. OUT_DIR gets lib/libcust_opapi.so, lib/libcust_opsproto_rt2.0.so, lib/libcust_opmaster_rt2.0.so and
#    opp.tar (the installed vendors/<vendor> package: point ASCEND_CUSTOM_OPP_PATH at it once unpacked).
set -euo pipefail

die() {
  echo "build_for_bazel.sh: $*" >&2
  exit 1
}

[ $# -eq 3 ] || die "usage: build_for_bazel.sh OUT_DIR 'op1;op2' 'soc1;soc2'"
OUT_DIR=$1
OPS=$2
SOCS=$3
IFS=';' read -r -a soc_list <<<"$SOCS"
[ ${#soc_list[@]} -gt 0 ] || die "no SOC given (e.g. 'ascend910b;ascend910_93')"
PROJECT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEFAULT_CANNS=(/usr/local/Ascend/ascend-toolkit/latest)
[ -n "${HOME:-}" ] && DEFAULT_CANNS+=("${HOME}/Ascend/ascend-toolkit/latest")
VENDOR=${ASCEND_VENDOR_NAME:-customize}

# 1. CANN and its tools
tried=()
CANN=""
if [ -n "${ASCEND_HOME_PATH:-}" ]; then
  tried+=("ASCEND_HOME_PATH=${ASCEND_HOME_PATH}")
  [ -d "${ASCEND_HOME_PATH}" ] && CANN=${ASCEND_HOME_PATH}
fi
if [ -z "$CANN" ] && [ -n "${ASCEND_TOOLKIT_PATH:-}" ]; then
  tried+=("ASCEND_TOOLKIT_PATH=${ASCEND_TOOLKIT_PATH}")
  [ -d "${ASCEND_TOOLKIT_PATH}" ] && CANN=${ASCEND_TOOLKIT_PATH}
fi
if [ -z "$CANN" ] && [ -n "${ASCEND_OPP_PATH:-}" ]; then
  tried+=("ASCEND_OPP_PATH=${ASCEND_OPP_PATH} (its parent)")
  candidate=$(dirname "${ASCEND_OPP_PATH}")
  [ -d "$candidate" ] && CANN=$candidate
fi
for candidate in "${DEFAULT_CANNS[@]}"; do
  [ -z "$CANN" ] || break
  tried+=("$candidate")
  [ -d "$candidate" ] && CANN=$candidate
done
[ -n "$CANN" ] || die "CANN not found (tried: ${tried[*]}). Install the CANN toolkit, or set ASCEND_HOME_PATH."
echo "build_for_bazel.sh: CANN at ${CANN}"

if [ -f "${CANN}/set_env.sh" ]; then
  # shellcheck disable=SC1091
  source "${CANN}/set_env.sh"
elif [ -f "${CANN}/bin/setenv.bash" ]; then
  # shellcheck disable=SC1091
  source "${CANN}/bin/setenv.bash"
else
  die "${CANN} has no set_env.sh (or bin/setenv.bash): is it a CANN toolkit install?"
fi

MSOPGEN=${CANN}/python/site-packages/bin/msopgen
[ -x "$MSOPGEN" ] || MSOPGEN=$(command -v msopgen || true)
if [ -z "$MSOPGEN" ] || [ ! -x "$MSOPGEN" ]; then
  die "msopgen (CANN's operator project generator) not found in ${CANN}/python/site-packages/bin or on PATH"
fi
BISHENG=${CANN}/compiler/ccec_compiler/bin/bisheng
[ -x "$BISHENG" ] || BISHENG=$(command -v bisheng || true)
if [ -z "$BISHENG" ] || [ ! -x "$BISHENG" ]; then
  die "bisheng (the AscendC kernel compiler) not found in ${CANN}/compiler/ccec_compiler/bin or on PATH"
fi
command -v cmake >/dev/null || die "cmake not found (CANN's operator build needs CMake >= 3.16)"
command -v python3 >/dev/null || die "python3 not found (msopgen and CANN's build scripts need it)"

IFS=';' read -r -a op_list <<<"$OPS"
[ ${#op_list[@]} -gt 0 ] || die "no operators given"
for op in "${op_list[@]}"; do
  for part in "${op}.json" op_host op_kernel; do
    [ -e "${PROJECT_DIR}/${op}/${part}" ] || die "operator '${op}' has no ${op}/${part} in ${PROJECT_DIR}"
  done
done

# 2. the generated op-package project
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
GEN=${OUT_DIR}/project
INSTALL_DIR=${OUT_DIR}/install
rm -rf "$GEN" "$INSTALL_DIR"
mkdir -p "$INSTALL_DIR"
descriptions=()
for op in "${op_list[@]}"; do descriptions+=("${PROJECT_DIR}/${op}/${op}.json"); done
python3 - "${OUT_DIR}/ops.json" "${descriptions[@]}" <<'PY'
import json, sys
ops = [entry for path in sys.argv[2:] for entry in json.load(open(path))]
json.dump(ops, open(sys.argv[1], "w"), indent=2)
PY
# the project's layout does not depend on the SOC: generate it for the first, build for all (ASCEND_COMPUTE_UNIT)
"$MSOPGEN" gen -i "${OUT_DIR}/ops.json" -f pytorch -c "ai_core-${soc_list[0]}" -lan cpp -out "$GEN"
for f in build.sh CMakePresets.json op_host op_kernel cmake; do
  [ -e "${GEN}/${f}" ] || die "msopgen generated no ${f} in ${GEN}"
done

# 3. our sources, presets and C++17
for op in "${op_list[@]}"; do
  rm -f "${GEN}/op_host/${op}".* "${GEN}/op_host/${op}"_*.* "${GEN}/op_kernel/${op}".* "${GEN}/op_kernel/${op}"_*.*
  cp -f "${PROJECT_DIR}/${op}/op_host/"* "${GEN}/op_host/"
  cp -f "${PROJECT_DIR}/${op}/op_kernel/"* "${GEN}/op_kernel/"
done
python3 - "${GEN}/CMakePresets.json" "${PROJECT_DIR}/CMakePresets.json" "$CANN" "$SOCS" "$VENDOR" <<'PY'
import json, sys
generated, ours, cann, soc, vendor = sys.argv[1:]
presets = json.load(open(generated))
preset = next(p for p in presets["configurePresets"] if p["name"] == "default")
values = preset.setdefault("cacheVariables", {})
values.update(json.load(open(ours))["cacheVariables"])
values["ASCEND_CANN_PACKAGE_PATH"] = {"type": "PATH", "value": cann}
values["ASCEND_COMPUTE_UNIT"] = {"type": "STRING", "value": soc}
values["vendor_name"] = {"type": "STRING", "value": vendor}
json.dump(presets, open(generated, "w"), indent=2)
PY
while IFS= read -r -d '' f; do
  sed -i 's/-std=c++11/-std=c++17/g' "$f"
done < <(find "${GEN}/cmake" -name '*.cmake' -print0)
if grep -rq -- '-std=c++11' "${GEN}/cmake"; then
  die "host code would still compile as C++11 (CANN's opbase headers need C++17): see ${GEN}/cmake"
fi

# 4. CANN's build, then its installer
(cd "$GEN" && bash build.sh)
RUN=$(find "${GEN}/build_out" -maxdepth 1 -name 'custom_opp_*.run' -print -quit 2>/dev/null || true)
[ -n "$RUN" ] || die "CANN's build.sh produced no custom_opp_*.run in ${GEN}/build_out"
bash "$RUN" --quiet --install-path="$INSTALL_DIR"

# 5. collect
PACKAGE=${INSTALL_DIR}/vendors/${VENDOR}
[ -d "$PACKAGE" ] || die "the installer put no operator package at ${PACKAGE}"
mkdir -p "${OUT_DIR}/lib"
for lib in libcust_opapi.so libcust_opsproto_rt2.0.so libcust_opmaster_rt2.0.so; do
  found=$(find "$PACKAGE" -name "$lib" -type f -print -quit 2>/dev/null || true)
  [ -n "$found" ] || die "the package has no ${lib}"
  cp -f "$found" "${OUT_DIR}/lib/${lib}"
done
tar -C "${INSTALL_DIR}/vendors" -cf "${OUT_DIR}/opp.tar" "$VENDOR"
echo "build_for_bazel.sh: ${OPS} for ${SOCS} -> ${OUT_DIR}/lib and ${OUT_DIR}/opp.tar"
