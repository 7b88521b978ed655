# Thin wrapper around CMake. `make run` and `make test` install missing
# Debian packages first (scripts/deps.sh), so they work on a fresh machine.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 600
CMAKE_FLAGS ?=

.PHONY: all deps build run test test-normal test-asan soak soak-asan fuzz bench format check-format clean

all: build

deps:
	@sh scripts/deps.sh build

build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVIDX_TESTS=OFF $(CMAKE_FLAGS)
	cmake --build build -j $(JOBS) --target kvidxd

run: build
	./build/kvidxd --set listen=127.0.0.1:8077

test:
	@sh scripts/deps.sh test
	$(MAKE) test-normal test-asan

test-normal:
	cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVIDX_WERROR=ON $(CMAKE_FLAGS)
	cmake --build build-test -j $(JOBS)
	cd build-test && ctest --output-on-failure -j $(JOBS)

test-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVIDX_WERROR=ON -DKVIDX_SANITIZE=ON $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j $(JOBS)

# Soak (not part of `make test`): tests/soak/soak.py against the build's
# kvidxd for SOAK_SECONDS; soak-asan: the ASan build for 60 s.
soak:
	@sh scripts/deps.sh test
	cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVIDX_WERROR=ON $(CMAKE_FLAGS)
	cmake --build build-test -j $(JOBS) --target kvidxd
	KVIDXD=$(CURDIR)/build-test/kvidxd SOAK_SECONDS=$(SOAK_SECONDS) python3 tests/soak/soak.py

soak-asan:
	@sh scripts/deps.sh test
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVIDX_WERROR=ON -DKVIDX_SANITIZE=ON $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS) --target kvidxd
	KVIDXD=$(CURDIR)/build-asan/kvidxd SOAK_ASAN=1 SOAK_SECONDS=60 \
		ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		python3 tests/soak/soak.py

fuzz:
	@sh scripts/deps.sh test
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DKVIDX_FUZZ=ON $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS)
	sh tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

bench:
	@sh scripts/deps.sh bench
	cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DKVIDX_TESTS=OFF -DKVIDX_BENCH=ON $(CMAKE_FLAGS)
	cmake --build build-bench -j $(JOBS)
	sh tests/bench/run.sh build-bench

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

check-format:
	clang-format --dry-run -Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-test build-asan build-fuzz build-bench
