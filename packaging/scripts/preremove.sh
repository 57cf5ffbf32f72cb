#!/bin/sh
# holdfast preremove, for deb (prerm) and rpm (%preun) alike.
#   deb: remove | upgrade new-version | deconfigure | failed-upgrade
#   rpm: 0 (erase) | 1+ (upgrade)
# On removal: stop and disable the service. An upgrade restarts it in the
# new package's postinstall instead.
set -e

case "$1" in
remove | 0) ;;
*) exit 0 ;;
esac

if [ -d /run/systemd/system ]; then
	systemctl stop holdfast.service || true
	systemctl disable holdfast.service || true
fi

exit 0
