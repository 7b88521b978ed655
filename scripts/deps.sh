#!/bin/sh
# Installs the Debian 12 packages kvidx needs, only those that are missing.
# Runs `apt-get update` first, and only when something has to be installed.
# Usage: scripts/deps.sh [build|test|bench]
set -eu
what=${1:-build}
pkgs="cmake make gcc pkg-config libuv1-dev libcjson-dev node-llhttp libsodium-dev libinih-dev libhiredis-dev"
case "$what" in
test) pkgs="$pkgs libcriterion-dev python3 python3-yaml clang clang-format libclang-rt-14-dev b3sum redis-server redis-tools" ;;
bench) pkgs="$pkgs libcriterion-dev python3 clang wrk nginx-light redis-server redis-tools" ;;
esac
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "kvidx: installing missing Debian packages:$missing"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends $missing
