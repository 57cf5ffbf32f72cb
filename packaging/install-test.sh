#!/usr/bin/env bash
# Install test for the holdfast packages under a real systemd (make install-test).
#
# Builds the deb and rpm for this machine's architecture, boots a throw-away
# copy of a Debian bookworm root (debootstrap, cached in $HOLDFAST_TEST_CACHE)
# with systemd-nspawn, and drives it with nsenter:
#   deb install -> active (Type=notify), verify, user, config mode/owner
#   publish N with acks -> restart -> N -> kill -9 -> systemd restarts it -> N
#   upgrade keeps a modified conffile and restarts the service -> N
#   remove stops and disables, keeps data; reinstall enables and starts -> N
#   a unit that never becomes ready is reported as failed (the check can fail)
#   purge deletes /var/lib/holdfast
#   rpm -i --nodeps -> active, publish, restart -> N, rpm -U keeps a modified
#   config and restarts it -> N, rpm -e stops it and keeps the data
# Before booting, it installs the deb into the root as a chroot (no running
# systemd, as in an image build): that must work and enable the service.
# On any failure it prints the unit's journal. Needs root, debootstrap,
# systemd-nspawn (systemd-container), nsenter and network access to the
# Debian archive the first time.
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
CACHE=${HOLDFAST_TEST_CACHE:-/var/cache/holdfast-test}
MIRROR=${HOLDFAST_TEST_MIRROR:-http://deb.debian.org/debian}
N=${HOLDFAST_TEST_MESSAGES:-200}
# procps: /bin/kill for ExecReload, a dependency of the deb.
ROOTFS_PACKAGES=systemd,systemd-sysv,dbus,procps,rpm

started=$(date +%s)
log() { printf '[install-test %3ds] %s\n' "$(($(date +%s) - started))" "$*"; }
die() { log "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it boots a container)"
for c in debootstrap systemd-nspawn nsenter; do
	command -v "$c" >/dev/null || die "$c not found: apt-get install debootstrap systemd-container util-linux"
done

# --- build ----------------------------------------------------------------
work=$(mktemp -d /var/tmp/holdfast-install-test.XXXXXX)
nspawn_pid= ct_pid=
cleanup() {
	local rc=$1
	if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
		kill -TERM "$nspawn_pid" 2>/dev/null || true
		for _ in $(seq 1 30); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.5; done
		kill -KILL "$nspawn_pid" 2>/dev/null || true
		wait "$nspawn_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
	if [ "$rc" = 0 ]; then log "PASS"; else log "FAILED (exit $rc)"; fi
}
trap 'cleanup $?' EXIT

arch=$("$GO" env GOARCH)
version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
v1=1.0.0~test1 v2=1.0.0~test2
log "building packages $v1 and $v2 for $arch"
HOLDFAST_DIST=$work/v1 GO=$GO packaging/build.sh "$version" "$commit" "$v1" "$arch" >"$work/build.log" 2>&1 ||
	{ cat "$work/build.log"; die "build of $v1"; }
HOLDFAST_DIST=$work/v2 GO=$GO packaging/build.sh "$version" "$commit" "$v2" "$arch" >>"$work/build.log" 2>&1 ||
	{ cat "$work/build.log"; die "build of $v2"; }
CGO_ENABLED=0 "$GO" build -trimpath -o "$work/nats" github.com/nats-io/natscli/nats ||
	die "build of the nats CLI"

# --- root file system, cached ---------------------------------------------
rootfs=$CACHE/rootfs
if [ ! -x "$rootfs/lib/systemd/systemd" ] || [ ! -x "$rootfs/usr/bin/rpm" ] || [ ! -x "$rootfs/bin/kill" ]; then
	log "creating the Debian bookworm root in $rootfs (debootstrap, about a minute)"
	mkdir -p "$CACHE"
	rm -rf "$CACHE/rootfs.tmp"
	debootstrap --variant=minbase --include="$ROOTFS_PACKAGES" bookworm "$CACHE/rootfs.tmp" "$MIRROR" \
		>"$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log"; die "debootstrap"; }
	rm -rf "$rootfs"
	mv "$CACHE/rootfs.tmp" "$rootfs"
fi
root=$work/root
log "copying the cached root"
cp -a --reflink=auto "$rootfs" "$root"
echo holdfast-test >"$root/etc/hostname"
mkdir -p "$root/root/pkgs"
cp "$work"/v1/holdfast_*.deb "$root/root/pkgs/v1.deb"
cp "$work"/v2/holdfast_*.deb "$root/root/pkgs/v2.deb"
cp "$work"/v1/holdfast-*.rpm "$root/root/pkgs/v1.rpm"
cp "$work"/v2/holdfast-*.rpm "$root/root/pkgs/v2.rpm"
install -m 0755 "$work/nats" "$root/usr/local/bin/nats"

# --- chroot (image build): no systemd running, the install must not fail --
log "dpkg -i in a chroot (no running systemd)"
mount --bind /proc "$root/proc"
chroot_rc=0
chroot "$root" dpkg -i /root/pkgs/v1.deb >"$work/chroot.log" 2>&1 || chroot_rc=$?
if [ "$chroot_rc" = 0 ]; then
	[ -L "$root/etc/systemd/system/multi-user.target.wants/holdfast.service" ] ||
		chroot_rc=enable
	chroot "$root" dpkg --purge holdfast >>"$work/chroot.log" 2>&1 || chroot_rc=purge
fi
umount "$root/proc"
[ "$chroot_rc" = 0 ] || { cat "$work/chroot.log"; die "chroot install: $chroot_rc"; }
log "chroot: installed and enabled for the next boot, then purged"

# --- boot -----------------------------------------------------------------
# descends_from PID ANCESTOR: whether ANCESTOR is PID's parent, grandparent, ...
descends_from() {
	local p=$1
	while [ -n "$p" ] && [ "$p" -gt 1 ]; do
		p=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null) || return 1
		[ "$p" = "$2" ] && return 0
	done
	return 1
}
log "booting it with systemd-nspawn"
systemd-nspawn -D "$root" --boot --pipe --register=no --keep-unit --private-network \
	--machine=holdfast-test </dev/null >"$work/console.log" 2>&1 &
nspawn_pid=$!

# The container's PID 1 is the systemd process below nspawn whose NSpid ends in 1.
deadline=$((SECONDS + 60))
while [ -z "$ct_pid" ]; do
	kill -0 "$nspawn_pid" 2>/dev/null || { cat "$work/console.log"; die "systemd-nspawn exited"; }
	[ $SECONDS -lt $deadline ] || { cat "$work/console.log"; die "container did not start"; }
	for p in $(pgrep -x systemd || true); do
		if awk '/^NSpid:/ { exit !($NF == 1 && NF > 2) }' "/proc/$p/status" 2>/dev/null &&
			[ -e "/proc/$p/root/run/systemd/private" ] &&
			descends_from "$p" "$nspawn_pid"; then
			ct_pid=$p
		fi
	done
	sleep 0.5
done

in_ct() {
	nsenter -t "$ct_pid" -a -- /usr/bin/env -i \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive HOME=/root "$@"
}
state=$(in_ct timeout 90 systemctl is-system-running --wait 2>&1 || true)
log "container systemd (pid $ct_pid on the host) is up: $state"

# From here on, a failure prints the unit's journal.
journal_on_failure() {
	local rc=$1
	if [ "$rc" != 0 ] && [ -n "$ct_pid" ] && kill -0 "$ct_pid" 2>/dev/null; then
		echo "----- systemctl status holdfast -----"
		in_ct systemctl status --no-pager holdfast.service 2>&1 || true
		echo "----- journalctl -u holdfast -----"
		in_ct journalctl --no-pager -u holdfast.service -n 200 2>&1 || true
	fi
}
trap 'rc=$?; journal_on_failure "$rc"; cleanup "$rc"' EXIT

# wait_active SECONDS: until holdfast.service is active (for Type=notify:
# after READY=1); fails at once if it failed, or when the time is up.
wait_active() {
	local deadline=$((SECONDS + $1)) s
	while :; do
		s=$(in_ct systemctl is-active holdfast.service 2>/dev/null || true)
		case $s in
		active) return 0 ;;
		failed) log "holdfast.service failed"; return 1 ;;
		esac
		[ $SECONDS -lt $deadline ] || { log "holdfast.service still '$s' after $1 s"; return 1; }
		sleep 0.3
	done
}
prop() { in_ct systemctl show -p "$1" --value holdfast.service; }
nats_() { in_ct nats --server nats://127.0.0.1:4222 --timeout 5s "$@"; }
publish() { nats_ pub -J -q --count "$1" orders.created "order {{Count}}" >/dev/null; }
stream_msgs() {
	# Only the stream's state has a "messages" key.
	nats_ stream info ORDERS --json | sed -n 's/^ *"messages": *\([0-9][0-9]*\),*$/\1/p'
}
expect_msgs() {
	local got
	got=$(stream_msgs) || die "stream info ORDERS failed ($1)"
	[ "$got" = "$2" ] || die "$1: ORDERS has $got messages, want $2"
	log "$1: ORDERS has $got messages"
}

# --- deb: install ---------------------------------------------------------
log "apt install ./v1.deb"
in_ct apt-get install -y -q /root/pkgs/v1.deb >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "apt install"; }
wait_active 60 || die "not active after install"
[ "$(in_ct systemctl is-enabled holdfast.service)" = enabled ] || die "not enabled after install"
[ "$(prop Type)" = notify ] || die "Type is not notify"
out=$(in_ct systemd-analyze verify /usr/lib/systemd/system/holdfast.service 2>&1) || die "systemd-analyze verify failed: $out"
[ -z "$out" ] || die "systemd-analyze verify printed: $out"
in_ct getent passwd holdfast >/dev/null || die "no holdfast user"
[ "$(in_ct stat -c '%a %U:%G' /etc/holdfast/holdfast.toml)" = "640 root:holdfast" ] ||
	die "config mode/owner: $(in_ct stat -c '%a %U:%G' /etc/holdfast/holdfast.toml)"
[ "$(in_ct stat -c '%U' /var/lib/holdfast/jetstream)" = holdfast ] || die "store dir not owned by holdfast"
log "installed: active, enabled, verify clean, user and config mode ok"

# --- messages survive restart and kill -9 ---------------------------------
publish "$N" || die "publish"
expect_msgs "after publishing" "$N"
pid=$(prop MainPID)
in_ct systemctl restart holdfast.service || die "restart"
wait_active 60 || die "not active after restart"
[ "$(prop MainPID)" != "$pid" ] || die "restart kept the same process"
expect_msgs "after systemctl restart" "$N"

pid=$(prop MainPID) restarts=$(prop NRestarts)
in_ct systemctl kill -s KILL holdfast.service
deadline=$((SECONDS + 60))
until [ "$(prop NRestarts)" -gt "$restarts" ] && [ "$(prop MainPID)" != "$pid" ] &&
	[ "$(prop ActiveState)" = active ]; do
	[ $SECONDS -lt $deadline ] || die "systemd did not restart holdfast after kill -9"
	sleep 0.3
done
expect_msgs "after kill -9 and restart by systemd (NRestarts $(prop NRestarts))" "$N"
publish "$N" || die "publish after kill"
expect_msgs "after publishing again" $((2 * N))

# --- upgrade keeps a modified conffile ------------------------------------
in_ct sed -i 's/^level = "info"/level = "debug"/' /etc/holdfast/holdfast.toml
in_ct grep -q '^level = "debug"' /etc/holdfast/holdfast.toml || die "could not modify the config"
pid=$(prop MainPID)
log "apt install ./v2.deb (upgrade)"
in_ct apt-get install -y -q -o Dpkg::Options::=--force-confold /root/pkgs/v2.deb >"$work/apt.log" 2>&1 ||
	{ cat "$work/apt.log"; die "upgrade"; }
[ "$(in_ct dpkg-query -W -f '${Version}' holdfast)" = "$v2-1" ] || die "version after upgrade"
in_ct grep -q '^level = "debug"' /etc/holdfast/holdfast.toml || die "upgrade replaced the modified config"
wait_active 60 || die "not active after upgrade"
[ "$(prop MainPID)" != "$pid" ] || die "upgrade did not restart the service"
expect_msgs "after upgrade (modified config kept, service restarted)" $((2 * N))

# --- remove keeps the data, reinstall starts again ------------------------
log "apt remove holdfast"
in_ct apt-get remove -y -q holdfast >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "remove"; }
s=$(in_ct systemctl is-active holdfast.service || true)
[ "$s" != active ] || die "still active after remove"
[ "$(in_ct systemctl is-enabled holdfast.service 2>/dev/null || true)" != enabled ] || die "still enabled after remove"
in_ct test -d /var/lib/holdfast/jetstream || die "remove deleted the data"
in_ct test -f /etc/holdfast/holdfast.toml || die "remove deleted the conffile"
log "removed: stopped ($s), disabled, data and config kept"
in_ct apt-get install -y -q -o Dpkg::Options::=--force-confold /root/pkgs/v2.deb >"$work/apt.log" 2>&1 ||
	{ cat "$work/apt.log"; die "reinstall"; }
wait_active 60 || die "not active after reinstall"
[ "$(in_ct systemctl is-enabled holdfast.service)" = enabled ] || die "not enabled after reinstall"
expect_msgs "after reinstall" $((2 * N))

# --- negative check: a unit that never becomes ready is a failure ---------
in_ct mkdir -p /run/systemd/system/holdfast.service.d
in_ct sh -c 'printf "[Service]\nExecStart=\nExecStart=/bin/sleep infinity\nTimeoutStartSec=3s\nRestart=no\n" >/run/systemd/system/holdfast.service.d/never-ready.conf'
in_ct systemctl daemon-reload
in_ct systemctl restart --no-block holdfast.service
if wait_active 30; then
	die "negative check: a service that never sent READY=1 was reported active"
fi
log "negative check: a unit that never becomes ready is detected ($(prop Result))"
in_ct rm -r /run/systemd/system/holdfast.service.d
in_ct systemctl daemon-reload
in_ct systemctl reset-failed holdfast.service
in_ct systemctl start holdfast.service || die "start after the negative check"
wait_active 60 || die "not active after the negative check"

# --- purge ----------------------------------------------------------------
log "dpkg --purge holdfast"
in_ct dpkg --purge holdfast >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "purge"; }
s=$(in_ct systemctl is-active holdfast.service || true)
[ "$s" != active ] || die "still active after purge"
! in_ct test -e /var/lib/holdfast || die "purge left /var/lib/holdfast"
! in_ct test -e /etc/holdfast/holdfast.toml || die "purge left the config"
log "purged: stopped, /var/lib/holdfast and /etc/holdfast gone"

# --- rpm ------------------------------------------------------------------
log "rpm -i --nodeps v1.rpm"
in_ct rpm -i --nodeps /root/pkgs/v1.rpm >"$work/rpm.log" 2>&1 || { cat "$work/rpm.log"; die "rpm -i"; }
wait_active 60 || die "rpm: not active after install"
[ "$(in_ct stat -c '%a %U:%G' /etc/holdfast/holdfast.toml)" = "640 root:holdfast" ] || die "rpm: config mode/owner"
publish "$N" || die "rpm: publish"
in_ct systemctl restart holdfast.service
wait_active 60 || die "rpm: not active after restart"
expect_msgs "rpm: after publishing and restart" "$N"
in_ct sed -i 's/^level = "info"/level = "debug"/' /etc/holdfast/holdfast.toml
pid=$(prop MainPID)
in_ct rpm -U --nodeps /root/pkgs/v2.rpm >"$work/rpm.log" 2>&1 || { cat "$work/rpm.log"; die "rpm -U"; }
[ "$(in_ct rpm -q --qf '%{VERSION}' holdfast)" = "$v2" ] || die "rpm: version after upgrade"
in_ct grep -q '^level = "debug"' /etc/holdfast/holdfast.toml || die "rpm -U replaced the modified config"
wait_active 60 || die "rpm: not active after upgrade"
[ "$(prop MainPID)" != "$pid" ] || die "rpm -U did not restart the service"
[ "$(in_ct systemctl is-enabled holdfast.service)" = enabled ] || die "rpm: not enabled after upgrade"
expect_msgs "rpm: after rpm -U (modified config kept, service restarted)" "$N"
in_ct rpm -e holdfast >"$work/rpm.log" 2>&1 || { cat "$work/rpm.log"; die "rpm -e"; }
s=$(in_ct systemctl is-active holdfast.service || true)
[ "$s" != active ] || die "rpm: still active after rpm -e"
in_ct test -d /var/lib/holdfast/jetstream || die "rpm -e deleted the data"
log "rpm: installed, active, restarted without loss, erased (stopped, data kept)"
