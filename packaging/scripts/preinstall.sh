#!/bin/sh
# holdfast preinstall, for deb (preinst) and rpm (%pre) alike.
#   deb: install [old-version] | upgrade old-version | abort-upgrade new-version
#   rpm: 1 (install) | 2+ (upgrade)
# Creates the holdfast system user before the files are unpacked, so that
# /etc/holdfast/holdfast.toml gets its group (root:holdfast 0640).
set -e

if ! getent passwd holdfast >/dev/null 2>&1; then
	if command -v systemd-sysusers >/dev/null 2>&1; then
		# Same line as /usr/lib/sysusers.d/holdfast.conf, which is not
		# unpacked yet.
		echo 'u holdfast - "holdfast message appliance" /var/lib/holdfast' |
			systemd-sysusers -
	else
		nologin=/usr/sbin/nologin
		[ -x "$nologin" ] || nologin=/sbin/nologin
		useradd --system --user-group --no-create-home \
			--home-dir /var/lib/holdfast --shell "$nologin" \
			--comment "holdfast message appliance" holdfast
	fi
fi

exit 0
