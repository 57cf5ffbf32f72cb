#!/bin/sh
# holdfast postinstall, for deb (postinst) and rpm (%post) alike.
#   deb: configure [old-version] | abort-upgrade | abort-remove | abort-deconfigure
#   rpm: 1 (install) | 2+ (upgrade)
# Install: enable and start the service. Upgrade: restart it if it runs.
#
# On Debian the enablement goes through deb-systemd-helper and starting
# through deb-systemd-invoke (init-system-helpers, an essential package), as
# debhelper's dh_installsystemd does: an admin's "systemctl disable" survives
# remove + reinstall, policy-rc.d (exit 101: do not start) is honoured, and
# purge removes exactly the symlinks made here.
# The rpm uses plain systemctl (also where deb-systemd-helper exists). The rpm enables the service on install
# deliberately instead of applying the preset policy: holdfast is an appliance
# and distributions' default presets ("disable *") would leave it off after
# every install; to keep it off, mask it first (systemctl mask holdfast).
#
# Nothing here fails the install: systemctl only talks to systemd when it runs
# ([ -d /run/systemd/system ]); in a chroot or an image build the service is
# only enabled and starts at the first boot. A masked unit is left masked and
# is not started.
set -e

unit=holdfast.service
removed_marker=/var/lib/holdfast/.package-removed

deb=
case "$1" in
configure)
	deb=1
	action=upgrade
	# A reinstall after "dpkg --remove" (config files kept) passes the old
	# version too, but the service was stopped then: start it as on install.
	if [ -z "$2" ] || [ -e "$removed_marker" ]; then
		action=install
	fi
	;;
abort-*) deb=1 action=upgrade ;;
1) action=install ;;
[2-9] | [1-9][0-9]*) action=upgrade ;;
*) exit 0 ;;
esac
rm -f "$removed_marker"

systemd_running=
[ -d /run/systemd/system ] && systemd_running=1

if [ -n "$systemd_running" ]; then
	systemctl --system daemon-reload >/dev/null 2>&1 || true
	# sysusers.d entry from this package (the user exists since preinstall).
	if command -v systemd-sysusers >/dev/null 2>&1; then
		systemd-sysusers holdfast.conf || true
	fi
fi

if [ -n "$deb" ] && command -v deb-systemd-helper >/dev/null 2>&1; then
	# Only removes the mask that postremove set on "remove", never an admin's.
	deb-systemd-helper unmask "$unit" >/dev/null 2>&1 || true
	# True on a first install; false when the admin disabled it before a
	# remove + reinstall or an upgrade.
	if deb-systemd-helper --quiet was-enabled "$unit"; then
		deb-systemd-helper enable "$unit" >/dev/null 2>&1 || true
	else
		deb-systemd-helper update-state "$unit" >/dev/null 2>&1 || true
	fi
	invoke=deb-systemd-invoke
elif command -v systemctl >/dev/null 2>&1; then
	if [ "$action" = install ]; then
		# A masked unit makes this fail: it stays masked.
		systemctl --no-reload enable "$unit" >/dev/null 2>&1 || true
	fi
	invoke=systemctl
else
	exit 0
fi

[ -n "$systemd_running" ] || exit 0

if [ "$(systemctl is-enabled "$unit" 2>/dev/null || true)" = masked ]; then
	[ "$action" = upgrade ] || echo "holdfast: $unit is masked: not starting it" >&2
	exit 0
fi
if [ "$action" = install ]; then
	# deb-systemd-invoke does not start a disabled or masked unit.
	if ! $invoke start "$unit"; then
		echo "holdfast: the service did not start; see: systemctl status holdfast; journalctl -u holdfast" >&2
	fi
else
	if ! $invoke try-restart "$unit"; then
		echo "holdfast: the service did not restart; see: systemctl status holdfast; journalctl -u holdfast" >&2
	fi
fi

exit 0
