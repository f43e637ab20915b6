#!/usr/bin/env bash
# Install the system packages the test suite needs, only when they are missing.
#
# The host's services are never stopped, disabled or reconfigured: the tests
# start their own mosquitto, gpsd and dovecot on free ports and do not care
# whether the host runs its own (a hub may well run Home Assistant's broker).
#
# On Debian/Ubuntu, a package that is installed here for the first time would
# normally start its service right away. To avoid that without changing the
# host for good, a policy-rc.d that refuses service starts ("exit 101", the
# Debian mechanism honoured by invoke-rc.d and deb-systemd-invoke) is put in
# place only while apt-get runs, only when a package with a service is newly
# installed, and only when the host has no policy-rc.d of its own; it is
# removed when this script ends. The units stay enabled as Debian's packaging
# leaves them, so they start at the next boot (mosquitto 2 and gpsd.socket
# listen on loopback only by default; Debian's dovecot listens on the IMAP
# ports of every interface, for the system's accounts); to keep them off
# for good, run `sudo systemctl disable mosquitto.service gpsd.service
# gpsd.socket dovecot.service` yourself.
set -euo pipefail

need=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
command -v gpsd >/dev/null 2>&1 || [ -x /usr/sbin/gpsd ] || need+=(gpsd)
command -v gpsfake >/dev/null 2>&1 || need+=(gpsd-clients)
# the sync job's IMAP tests run their own dovecot (the IMAP server of Debian)
command -v dovecot >/dev/null 2>&1 || [ -x /usr/sbin/dovecot ] || need+=(dovecot-imapd)
command -v g++ >/dev/null 2>&1 || need+=(g++)
# the memory page's browser test (selenium drives Debian's headless Chromium)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "missing: ${need[*]}; install them with your package manager (apt-get not found)" >&2
  exit 1
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
POLICY=/usr/sbin/policy-rc.d
POLICY_MARK="# reverie install-system-deps.sh: temporary, removed when it ends"

# Packages of ours that ship a service and are not installed yet.
fresh_services=()
for pkg in "${need[@]}"; do
  case "$pkg" in
    mosquitto|gpsd|dovecot-imapd)
      status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
      [ "$status" = "install ok installed" ] || fresh_services+=("$pkg")
      ;;
  esac
done

remove_policy() {
  # Only our own file: never a policy-rc.d the host had, or one that replaced ours.
  if [ -f "$POLICY" ] && grep -qxF "$POLICY_MARK" "$POLICY" 2>/dev/null; then
    $SUDO rm -f "$POLICY"
  fi
}

if [ ${#fresh_services[@]} -gt 0 ]; then
  if [ -e "$POLICY" ] || [ -L "$POLICY" ]; then
    echo "note: $POLICY exists; left as it is (its policy decides whether" \
         "${fresh_services[*]} start now)"
  else
    trap remove_policy EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP
    # noclobber: never replace a policy-rc.d that appeared meanwhile.
    printf '#!/bin/sh\n%s\n# Refuse every service action while packages are installed.\nexit 101\n' \
      "$POLICY_MARK" | $SUDO sh -c "set -C; cat > '$POLICY' && chmod 0755 '$POLICY'"
    echo "not starting the new services (${fresh_services[*]}) while installing"
  fi
fi

echo "installing system packages: ${need[*]}"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq || true
$SUDO env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${need[@]}"
