#!/bin/sh
# holdfast postinstall, for deb (postinst) and rpm (%post) alike.
#   deb: configure [old-version] | abort-upgrade | abort-remove | abort-deconfigure
#   rpm: 1 (install) | 2+ (upgrade)
# Install: enable and start the service. Upgrade: restart it if it runs.
# systemctl only talks to systemd when it runs ([ -d /run/systemd/system ]);
# in a chroot or an image build the service is only enabled, and a failure
# there is ignored, so that the install never fails for it.
set -e

removed_marker=/var/lib/holdfast/.package-removed

action=upgrade
case "$1" in
configure)
	# A reinstall after "dpkg --remove" (config files kept) passes the old
	# version too, but the service was disabled then: treat it as an install.
	if [ -z "$2" ] || [ -e "$removed_marker" ]; then
		action=install
	fi
	;;
abort-*) action=upgrade ;;
1) action=install ;;
[2-9] | [1-9][0-9]*) action=upgrade ;;
*) exit 0 ;;
esac
rm -f "$removed_marker"

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	# sysusers.d entry from this package (the user exists since preinstall).
	if command -v systemd-sysusers >/dev/null 2>&1; then
		systemd-sysusers holdfast.conf || true
	fi
	if [ "$action" = install ]; then
		systemctl enable holdfast.service
		if ! systemctl start holdfast.service; then
			echo "holdfast: the service did not start; see: journalctl -u holdfast" >&2
		fi
	else
		if ! systemctl try-restart holdfast.service; then
			echo "holdfast: the service did not restart; see: journalctl -u holdfast" >&2
		fi
	fi
elif [ "$action" = install ] && command -v systemctl >/dev/null 2>&1; then
	# No running systemd (chroot, image build): only create the enablement
	# symlink, so that the service starts when the image boots.
	systemctl --no-reload enable holdfast.service >/dev/null 2>&1 || true
fi

exit 0
