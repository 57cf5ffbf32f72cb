#!/bin/sh
# holdfast postremove, for deb (postrm) and rpm (%postun) alike.
#   deb: remove | purge | upgrade | failed-upgrade | abort-install | abort-upgrade | disappear
#   rpm: 0 (erase) | 1+ (upgrade)
# The data in /var/lib/holdfast is only deleted on "dpkg --purge" (rpm has
# no purge: "rpm -e" keeps it). The holdfast user is kept, as it may still
# own files.
#
# On Debian, deb-systemd-helper masks the unit on remove (its file is gone,
# the enablement symlinks are kept for a reinstall) and deletes every symlink
# and record it made on purge, as debhelper does.
set -e

unit=holdfast.service

case "$1" in
remove | 0)
	if [ "$1" = remove ] && command -v deb-systemd-helper >/dev/null 2>&1; then
		deb-systemd-helper mask "$unit" >/dev/null 2>&1 || true
	fi
	# Lets the next install of this package start the service again.
	if [ "$1" = remove ] && [ -d /var/lib/holdfast ]; then
		: >/var/lib/holdfast/.package-removed
	fi
	;;
purge)
	if command -v deb-systemd-helper >/dev/null 2>&1; then
		deb-systemd-helper purge "$unit" >/dev/null 2>&1 || true
		deb-systemd-helper unmask "$unit" >/dev/null 2>&1 || true
	fi
	rm -rf /var/lib/holdfast
	rmdir /etc/holdfast 2>/dev/null || true
	;;
*) exit 0 ;;
esac

if [ -d /run/systemd/system ]; then
	systemctl --system daemon-reload >/dev/null 2>&1 || true
fi

exit 0
