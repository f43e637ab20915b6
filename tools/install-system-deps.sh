#!/usr/bin/env bash
# Install the system packages the test suite needs, only when they are missing.
set -euo pipefail
need=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
command -v gpsd >/dev/null 2>&1 || [ -x /usr/sbin/gpsd ] || need+=(gpsd)
command -v gpsfake >/dev/null 2>&1 || need+=(gpsd-clients)
command -v g++ >/dev/null 2>&1 || need+=(g++)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "installing system packages: ${need[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
# The packages' own services are not wanted: tests start their own instances.
for svc in mosquitto gpsd gpsd.socket; do
  $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
done
