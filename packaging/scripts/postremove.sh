#!/bin/sh
# holdfast postremove, for deb (postrm) and rpm (%postun) alike.
#   deb: remove | purge | upgrade | failed-upgrade | abort-install | abort-upgrade | disappear
#   rpm: 0 (erase) | 1+ (upgrade)
# The data in /var/lib/holdfast is only deleted on "dpkg --purge" (rpm has
# no purge: "rpm -e" keeps it). The holdfast user is kept, as it may still
# own files.
set -e

case "$1" in
remove | 0)
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload || true
	fi
	# Lets the next install of this package enable the service again.
	if [ "$1" = remove ] && [ -d /var/lib/holdfast ]; then
		: >/var/lib/holdfast/.package-removed
	fi
	;;
purge)
	rm -rf /var/lib/holdfast
	rmdir /etc/holdfast 2>/dev/null || true
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload || true
	fi
	;;
esac

exit 0
