# rtp_add_custom_op(op): collects an operator's host sources and kernel; rtp_finish_custom_op_package()
# builds the three host libraries, the kernels, and installs the vendor package.
set(_RTP_DEF_SOURCES "")
set(_RTP_TILING_SOURCES "")
set(_RTP_ACLNN_SOURCES "")
set(_RTP_ACLNN_HEADERS "")
set(_RTP_KERNELS "")
set(_RTP_HOST_INCLUDES "")

macro(rtp_add_custom_op op)
  file(GLOB _def ${CMAKE_CURRENT_SOURCE_DIR}/${op}/op_host/*_def.cpp)
  file(GLOB _tiling ${CMAKE_CURRENT_SOURCE_DIR}/${op}/op_host/*_tiling.cpp)
  file(GLOB _aclnn ${CMAKE_CURRENT_SOURCE_DIR}/${op}/op_host/aclnn_*.cpp)
  file(GLOB _aclnn_h ${CMAKE_CURRENT_SOURCE_DIR}/${op}/op_host/aclnn_*.h)
  list(APPEND _RTP_DEF_SOURCES ${_def})
  list(APPEND _RTP_TILING_SOURCES ${_tiling})
  list(APPEND _RTP_ACLNN_SOURCES ${_aclnn})
  list(APPEND _RTP_ACLNN_HEADERS ${_aclnn_h})
  list(APPEND _RTP_KERNELS ${CMAKE_CURRENT_SOURCE_DIR}/${op}/op_kernel/${op}.cpp)
  list(APPEND _RTP_HOST_INCLUDES ${CMAKE_CURRENT_SOURCE_DIR}/${op}/op_host)
endmacro()

function(_rtp_host_library name)
  add_library(${name} SHARED ${ARGN})
  target_compile_options(${name} PRIVATE ${OP_HOST_FLAGS})
  target_include_directories(${name} PRIVATE ${_RTP_HOST_INCLUDES} ${CANN_INCLUDE} ${CANN_INCLUDE}/experiment
                             ${CANN_INCLUDE}/experiment/platform ${CANN_INCLUDE}/aclnn)
  target_link_directories(${name} PRIVATE ${CANN_LIB})
endfunction()

macro(rtp_finish_custom_op_package)
  # op definitions + shape inference
  _rtp_host_library(cust_op_proto ${_RTP_DEF_SOURCES})
  target_link_libraries(cust_op_proto PRIVATE register graph exe_graph)
  set_target_properties(cust_op_proto PROPERTIES OUTPUT_NAME cust_opsproto_rt2.0)
  # tiling
  _rtp_host_library(cust_optiling ${_RTP_TILING_SOURCES} ${_RTP_DEF_SOURCES})
  target_link_libraries(cust_optiling PRIVATE register tiling_api platform graph exe_graph)
  set_target_properties(cust_optiling PROPERTIES OUTPUT_NAME cust_opmaster_rt2.0)
  # aclnn entry points
  _rtp_host_library(cust_opapi ${_RTP_ACLNN_SOURCES})
  target_link_libraries(cust_opapi PRIVATE ascendcl nnopbase opapi)

  # kernels, compiled by bisheng through CANN's AscendC CMake support
  include(${ASCENDC_CMAKE_DIR}/ascendc.cmake)
  ascendc_library(cust_kernels SHARED ${_RTP_KERNELS})
  ascendc_compile_definitions(cust_kernels PRIVATE -DASCENDC_DUMP=0)

  install(TARGETS cust_opapi LIBRARY DESTINATION ${VENDOR_DIR}/op_api/lib)
  install(FILES ${_RTP_ACLNN_HEADERS} DESTINATION ${VENDOR_DIR}/op_api/include)
  install(TARGETS cust_op_proto LIBRARY DESTINATION ${VENDOR_DIR}/op_proto/lib/linux/${ARCH})
  install(TARGETS cust_optiling LIBRARY DESTINATION ${VENDOR_DIR}/op_impl/ai_core/tbe/op_tiling/lib/linux/${ARCH})
  install(TARGETS cust_kernels LIBRARY DESTINATION ${VENDOR_DIR}/op_impl/ai_core/tbe/kernel/${ASCEND_COMPUTE_UNIT})
endmacro()
