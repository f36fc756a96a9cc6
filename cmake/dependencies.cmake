# Third-party libraries, all from Debian packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# ICU: Unicode normalization (NFC/NFKC) for tokenizer.json normalizers.
pkg_check_modules(ICU_UC REQUIRED IMPORTED_TARGET icu-uc)
pkg_check_modules(URING IMPORTED_TARGET liburing)
pkg_check_modules(CBC IMPORTED_TARGET cbc)

# OpenBLAS: prefer the pthread/openmp variant Debian installs as libopenblas.
find_library(OPENBLAS_LIB NAMES openblas REQUIRED)
find_path(OPENBLAS_INCLUDE NAMES cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
          /usr/include/openblas /usr/include REQUIRED)
add_library(ferry_openblas INTERFACE)
target_link_libraries(ferry_openblas INTERFACE ${OPENBLAS_LIB})
target_include_directories(ferry_openblas SYSTEM INTERFACE ${OPENBLAS_INCLUDE})

if(FERRY_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(FERRY_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
