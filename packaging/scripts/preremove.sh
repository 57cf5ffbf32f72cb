#!/bin/sh
# holdfast preremove, for deb (prerm) and rpm (%preun) alike.
#   deb: remove | upgrade new-version | deconfigure | failed-upgrade
#   rpm: 0 (erase) | 1+ (upgrade)
# On removal: stop the service (only when systemd runs) and disable it (even
# when it does not, e.g. in a chroot or an image build, so that no enablement
# symlink is left behind). An upgrade restarts it in the new package's
# postinstall instead. The backup timer, which only an admin enables, is
# stopped and disabled on removal the same way, with plain systemctl on deb
# and rpm alike (the package never enabled it, so deb-systemd-helper has no
# record of it); its backups in /var/lib/holdfast-backup are kept.
#
# On Debian, as with debhelper: deb-systemd-invoke stops it (honouring
# policy-rc.d), and the enablement stays recorded by deb-systemd-helper until
# purge (postremove), so that a reinstall keeps an admin's enable or disable.
set -e

unit=holdfast.service
backup_units="holdfast-backup.timer holdfast-backup.service"

case "$1" in
remove | 0) ;;
*) exit 0 ;;
esac

# deb: with deb-systemd-helper (always on Debian: init-system-helpers is
# essential); rpm, or a deb without it: plain systemctl.
dsh=
if [ "$1" = remove ] && command -v deb-systemd-helper >/dev/null 2>&1; then
	dsh=1
fi

if [ -d /run/systemd/system ]; then
	systemctl stop $backup_units >/dev/null 2>&1 || true
	if [ -n "$dsh" ]; then
		deb-systemd-invoke stop "$unit" >/dev/null || true
	else
		systemctl stop "$unit" || true
	fi
fi
if command -v systemctl >/dev/null 2>&1; then
	if [ -z "$dsh" ]; then
		systemctl --no-reload disable "$unit" >/dev/null 2>&1 || true
	fi
	systemctl --no-reload disable holdfast-backup.timer >/dev/null 2>&1 || true
fi

exit 0
