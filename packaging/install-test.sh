#!/usr/bin/env bash
# Install test for the holdfast packages under a real systemd (make install-test).
#
# Builds the deb and rpm for this machine's architecture, boots a throw-away
# copy of a Debian bookworm root (debootstrap, cached in $HOLDFAST_TEST_CACHE)
# with systemd-nspawn, and drives it with nsenter:
#   deb install -> active (Type=notify), verify, user, config mode/owner
#   publish N with acks -> restart -> N -> kill -9 -> systemd restarts it -> N
#   a reload with a broken config fails and keeps the service running
#   upgrade keeps a modified conffile and restarts the service -> N
#   remove stops it, keeps data; reinstall enables and starts -> N; an
#   admin's disable survives remove + reinstall
#   a unit that never becomes ready is reported as failed (the check can fail)
#   systemctl stop while exec handlers run: they finish and are acked
#   purge deletes /var/lib/holdfast and leaves no file behind
#   a masked unit: the install succeeds and does not start it
#   policy-rc.d exit 101: the install succeeds and does not start it
#   upgrade from the package of an older commit (built by that commit's own
#   packaging/build.sh, cached): N processed, WORKER1 stopped in a modified
#   conffile, M more published -> apt install of the current deb keeps the
#   config, the messages, the last sequence and the ack floor N, restarts
#   it; an exec handler then handles exactly N+1..N+M (redeliveries counted)
#   rpm -i --nodeps -> active, publish, restart -> N, rpm -U keeps a modified
#   config and restarts it -> N, rpm -e stops and disables it, keeps the data
#   the same upgrade from the older commit's rpm with rpm -U
# Before booting, it installs the deb into the root as a chroot (no running
# systemd, as in an image build): that must work and enable the service,
# and purge must leave no file behind; piuparts (when installed) checks
# install and purge of the deb in a copy of the same root meanwhile.
# On any failure it prints the unit's journal. Needs root, debootstrap,
# systemd-nspawn (systemd-container), nsenter and network access to the
# Debian archive the first time (and for piuparts, which runs apt-get update),
# and the full git history (the older commit).
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
CACHE=${HOLDFAST_TEST_CACHE:-/var/cache/holdfast-test}
MIRROR=${HOLDFAST_TEST_MIRROR:-http://deb.debian.org/debian}
N=${HOLDFAST_TEST_MESSAGES:-200}
# procps: /bin/kill, which the cached root is checked for.
ROOTFS_PACKAGES=systemd,systemd-sysv,dbus,procps,rpm

started=$(date +%s)
log() { printf '[install-test %3ds] %s\n' "$(($(date +%s) - started))" "$*"; }
die() { log "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it boots a container)"
for c in debootstrap systemd-nspawn nsenter; do
	command -v "$c" >/dev/null || die "$c not found: apt-get install debootstrap systemd-container util-linux"
done

# --- build ----------------------------------------------------------------
# The older commit whose packages the upgrade starts from (see below).
old_commit=76f829b0718ce0f90fc555ae3f930325f0781244 v0=0.9.0~old
# A shallow clone lacks it: the rest of the test runs, this part is
# skipped with a SKIP line saying so (the final line repeats it).
old_skip=
git rev-parse --quiet --verify "$old_commit^{commit}" >/dev/null ||
	old_skip="commit $old_commit (the older package to upgrade from) is not in this clone: the upgrade from it needs the full history (git fetch --unshallow)"
work=$(mktemp -d /var/tmp/holdfast-install-test.XXXXXX)
nspawn_pid= ct_pid= piuparts_pid= rest_pid=
cleanup() {
	local rc=$1
	if [ -n "$rest_pid" ]; then
		kill -TERM -- "-$rest_pid" 2>/dev/null || true
		wait "$rest_pid" 2>/dev/null || true
	fi
	# piuparts mounts /proc and more in its chroot below $work: it must
	# have ended, and left nothing mounted there, before $work goes.
	if [ -n "$piuparts_pid" ] && kill -0 "$piuparts_pid" 2>/dev/null; then
		kill -TERM "$piuparts_pid" 2>/dev/null || true
		wait "$piuparts_pid" 2>/dev/null || true
	fi
	findmnt -rn -o TARGET | grep "^$work/" | sort -r | xargs -r umount -l 2>/dev/null || true
	if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
		kill -TERM "$nspawn_pid" 2>/dev/null || true
		for _ in $(seq 1 30); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.5; done
		kill -KILL "$nspawn_pid" 2>/dev/null || true
		wait "$nspawn_pid" 2>/dev/null || true
	fi
	# A copy still under way when a signal ended the test (cp -a of the
	# root, piuparts' own) may write into $work after the first try.
	for _ in 1 2 3 4 5; do rm -rf "$work" 2>/dev/null && break; sleep 1; done
	if [ "$rc" = 0 ]; then log "PASS${old_skip:+ (SKIPPED: $old_skip)}"; else log "FAILED (exit $rc)"; fi
}
trap 'cleanup $?' EXIT
# Stopped by a signal, the test failed: the EXIT trap would see $? = 0.
trap 'exit 143' TERM
trap 'exit 130' INT

arch=$("$GO" env GOARCH)
version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
v1=1.0.0~test1 v2=1.0.0~test2
log "building packages $v1 for $arch"
HOLDFAST_DIST=$work/v1 GO=$GO packaging/build.sh "$version" "$commit" "$v1" "$arch" >"$work/build.log" 2>&1 ||
	{ cat "$work/build.log"; die "build of $v1"; }
# $v2 and the nats CLI are first needed once the container runs holdfast:
# they build meanwhile (the chroot, piuparts and the boot mostly wait),
# and rest_ready waits for them.
log "building packages $v2 and the nats CLI, beside the rest"
# In a session of its own (setsid: its pid is its process group), so that
# cleanup stops all of it, the go and nfpm processes under build.sh too.
HOLDFAST_DIST=$work/v2 GO=$GO setsid sh -c '
	packaging/build.sh "$1" "$2" "$3" "$4" &&
		CGO_ENABLED=0 "$GO" build -trimpath -o "$5" github.com/nats-io/natscli/nats
' sh "$version" "$commit" "$v2" "$arch" "$work/nats" >"$work/build-rest.log" 2>&1 &
rest_pid=$!
# rest_ready waits for that build and puts its packages and the nats CLI
# into the container's root.
rest_ready() {
	local rc=0
	wait "$rest_pid" || rc=$?
	rest_pid=
	[ "$rc" = 0 ] || { cat "$work/build-rest.log"; die "build of $v2 or the nats CLI"; }
	cp "$work"/v2/holdfast_*.deb "$root/root/pkgs/v2.deb"
	cp "$work"/v2/holdfast-*.rpm "$root/root/pkgs/v2.rpm"
	# Under /root, which the file lists leave out: it arrives after the
	# list taken before the install.
	install -m 0755 "$work/nats" "$root/root/nats"
	log "packages $v2 and the nats CLI built"
}

# The packages of an older commit, built by that commit's own packaging/build.sh,
# for the upgrade from an older package. 7f82033 added the packaging but
# does not compile (cmd/holdfast calls pipeline.NewLogHandler, committed
# later); 76f829b ("pipeline: built-in log, exec and http handlers") is the
# first commit after it that builds. Its build.sh takes VERSION COMMIT
# PKG_VERSION ARCH and $HOLDFAST_DIST, and derives the files' mtime from git,
# which an archive lacks: SOURCE_DATE_EPOCH is given. The packages are cached
# in $CACHE, keyed by commit, version and architecture.
old_cache=$CACHE/old-packages/$old_commit-$v0-$arch
if [ -n "$old_skip" ]; then
	log "SKIP: $old_skip"
elif [ ! -f "$old_cache/old.deb" ] || [ ! -f "$old_cache/old.rpm" ]; then
	log "building packages $v0 of the older commit ${old_commit:0:7}"
	mkdir -p "$work/old-src"
	git archive "$old_commit" | tar -x -C "$work/old-src"
	(cd "$work/old-src" && SOURCE_DATE_EPOCH=$(git -C "$OLDPWD" log -1 --format=%ct "$old_commit") \
		HOLDFAST_DIST=$work/v0 GO=$GO packaging/build.sh "${old_commit:0:7}" "${old_commit:0:7}" "$v0" "$arch") \
		>>"$work/build.log" 2>&1 || { cat "$work/build.log"; die "build of $v0 at ${old_commit:0:7}"; }
	mkdir -p "$CACHE/old-packages"
	rm -rf "$old_cache.tmp"
	mkdir "$old_cache.tmp"
	cp "$work"/v0/holdfast_*.deb "$old_cache.tmp/old.deb"
	cp "$work"/v0/holdfast-*.rpm "$old_cache.tmp/old.rpm"
	rm -rf "$old_cache" "$work/old-src"
	mv "$old_cache.tmp" "$old_cache"
fi

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

# --- piuparts: install and purge in a copy of the root, no systemd running --
# It works on its own copy of the cached root and takes over a minute
# (apt-get update, install, purge, two scans of the file system): it runs
# beside the chroot and the container below, and its result is waited for
# at the end.
if command -v piuparts >/dev/null 2>&1; then
	log "piuparts (install, purge) on v1.deb: started, runs beside the rest"
	piuparts --existing-chroot="$rootfs" --distribution=bookworm --mirror="$MIRROR" \
		--keep-sources-list --no-upgrade-test --tmpdir="$work" \
		"$work"/v1/holdfast_*.deb >"$work/piuparts.log" 2>&1 &
	piuparts_pid=$!
elif [ -n "${HOLDFAST_REQUIRE_PIUPARTS:-}" ]; then
	die "piuparts not installed (apt-get install piuparts)"
else
	log "piuparts not installed (apt-get install piuparts): skipped; the chroot's purge check below covers its file check"
fi

root=$work/root
log "copying the cached root"
cp -a --reflink=auto "$rootfs" "$root"
echo holdfast-test >"$root/etc/hostname"
mkdir -p "$root/root/pkgs"
cp "$work"/v1/holdfast_*.deb "$root/root/pkgs/v1.deb"
cp "$work"/v1/holdfast-*.rpm "$root/root/pkgs/v1.rpm"
[ -n "$old_skip" ] || cp "$old_cache/old.deb" "$old_cache/old.rpm" "$root/root/pkgs/"

# $file_list (a script): every file and directory of the system the package may touch,
# as piuparts compares them before install and after purge. Left out: what
# the system changes by itself (logs, caches, apt and dpkg state, systemd's
# own state, the backups useradd keeps of /etc/passwd and friends); the
# records of deb-systemd-helper are listed on their own.
file_list='
	export LC_ALL=C
	{
		find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp \
			-o -path /var/tmp -o -path /var/log -o -path /var/cache -o -path /var/lib/apt \
			-o -path /var/lib/dpkg -o -path /var/lib/systemd -o -path /root -o -path /var/lib/rpm \) -prune -o -print |
			grep -v -x -E "/etc/(passwd|group|shadow|gshadow|subuid|subgid)-|/etc/ld\.so\.cache"
		find /var/lib/systemd -path "*deb-systemd-helper*" ! -type d 2>/dev/null
	} | sort
'
# purge_left WHEN BEFORE AFTER: fails when AFTER has files BEFORE had not.
purge_left() {
	local left
	left=$(LC_ALL=C comm -13 "$2" "$3")
	[ -z "$left" ] || die "$1: purge left files on the system:"$'\n'"$left"
}

# --- chroot (image build): no systemd running, the install must not fail --
log "dpkg -i in a chroot (no running systemd)"
mount --bind /proc "$root/proc"
chroot_rc=0
chroot "$root" sh -c "$file_list" >"$work/files.before"
chroot "$root" dpkg -i /root/pkgs/v1.deb >"$work/chroot.log" 2>&1 || chroot_rc=$?
if [ "$chroot_rc" = 0 ]; then
	[ -L "$root/etc/systemd/system/multi-user.target.wants/holdfast.service" ] ||
		chroot_rc=enable
	chroot "$root" dpkg --purge holdfast >>"$work/chroot.log" 2>&1 || chroot_rc=purge
fi
chroot "$root" sh -c "$file_list" >"$work/files.after"
umount "$root/proc"
[ "$chroot_rc" = 0 ] || { cat "$work/chroot.log"; die "chroot install: $chroot_rc"; }
purge_left "chroot" "$work/files.before" "$work/files.after"
log "chroot: installed and enabled for the next boot, then purged without a trace"

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
nats_() { in_ct /root/nats --server nats://127.0.0.1:4222 --timeout 5s "$@"; }
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
# json_get PATH: the value at a dotted PATH (ack_floor.stream_seq) in the
# indented JSON of the nats CLI on stdin, one key per line.
json_get() {
	awk -v want="$1" '
		{ line = $0; sub(/^[ \t]+/, "", line) }
		line ~ /^[]}]/ { d--; next }
		{ key = ""; if (match(line, /^"[^"]*":/)) key = substr(line, 2, RLENGTH - 3) }
		line ~ /[[{]$/ { path[++d] = key; next }
		key != "" {
			p = ""
			for (i = 1; i <= d; i++) if (path[i] != "") p = p path[i] "."
			if (p key != want) next
			v = line; sub(/^"[^"]*": */, "", v); sub(/,$/, "", v); gsub(/"/, "", v)
			print v
		}'
}
stream_last_seq() { nats_ stream info ORDERS --json | json_get state.last_seq; }
# worker1_state: "ACK_FLOOR PENDING ACK_PENDING" of the consumer WORKER1.
worker1_state() {
	local info
	info=$(nats_ consumer info ORDERS WORKER1 --json) || return 1
	echo "$(json_get ack_floor.stream_seq <<<"$info") $(json_get num_pending <<<"$info") $(json_get num_ack_pending <<<"$info")"
}
# expect_worker1 WHEN FLOOR PENDING: waits up to 60 s until WORKER1's ack
# floor is FLOOR with PENDING messages not yet delivered and none out for
# processing.
expect_worker1() {
	local deadline=$((SECONDS + 60)) got
	while :; do
		got=$(worker1_state) || die "consumer info ORDERS WORKER1 failed ($1)"
		[ "$got" != "$2 $3 0" ] || break
		[ $SECONDS -lt $deadline ] ||
			die "$1: WORKER1 has ack floor, pending, ack pending '$got', want '$2 $3 0'"
		sleep 0.3
	done
	log "$1: WORKER1 ack floor $2, $3 pending"
}

# --- deb: install ---------------------------------------------------------
in_ct sh -c "$file_list" >"$work/files.before"
log "apt install ./v1.deb"
in_ct apt-get install -y -q /root/pkgs/v1.deb >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "apt install"; }
wait_active 60 || die "not active after install"
[ "$(in_ct systemctl is-enabled holdfast.service)" = enabled ] || die "not enabled after install"
[ "$(prop Type)" = notify ] || die "Type is not notify"
# --man=no: the container has no man-db to open Documentation=man:holdfast(1);
# the page itself is checked to be installed.
in_ct test -s /usr/share/man/man1/holdfast.1.gz || die "the manual page is not installed"
out=$(in_ct systemd-analyze verify --man=no /usr/lib/systemd/system/holdfast.service 2>&1) || die "systemd-analyze verify failed: $out"
[ -z "$out" ] || die "systemd-analyze verify printed: $out"
in_ct getent passwd holdfast >/dev/null || die "no holdfast user"
[ "$(in_ct stat -c '%a %U:%G' /etc/holdfast/holdfast.toml)" = "640 root:holdfast" ] ||
	die "config mode/owner: $(in_ct stat -c '%a %U:%G' /etc/holdfast/holdfast.toml)"
[ "$(in_ct stat -c '%U' /var/lib/holdfast/jetstream)" = holdfast ] || die "store dir not owned by holdfast"
log "installed: active, enabled, verify clean, user and config mode ok"

# --- messages survive restart and kill -9 ---------------------------------
rest_ready
publish "$N" || die "publish"
expect_msgs "after publishing" "$N"
pid=$(prop MainPID)
in_ct systemctl restart holdfast.service || die "restart"
wait_active 60 || die "not active after restart"
[ "$(prop MainPID)" != "$pid" ] || die "restart kept the same process"
expect_msgs "after systemctl restart" "$N"

pid=$(prop MainPID) restarts=$(prop NRestarts)
in_ct systemctl kill --kill-whom=main -s KILL holdfast.service
deadline=$((SECONDS + 60))
until [ "$(prop NRestarts)" -gt "$restarts" ] && [ "$(prop MainPID)" != "$pid" ] &&
	[ "$(prop ActiveState)" = active ]; do
	[ $SECONDS -lt $deadline ] || die "systemd did not restart holdfast after kill -9"
	sleep 0.3
done
expect_msgs "after kill -9 and restart by systemd (NRestarts $(prop NRestarts))" "$N"
publish "$N" || die "publish after kill"
expect_msgs "after publishing again" $((2 * N))

# --- nightly backup: installed disabled; a run backs up, in its sandbox ----
s=$(in_ct systemctl is-enabled holdfast-backup.timer 2>/dev/null || true)
[ "$s" = disabled ] || die "holdfast-backup.timer is '$s' after install, want disabled"
if ! in_ct systemctl start holdfast-backup.service; then
	in_ct journalctl --no-pager -u holdfast-backup.service -n 50 2>&1 || true
	die "systemctl start holdfast-backup.service failed"
fi
bk=$(in_ct find /var/lib/holdfast-backup -mindepth 1 -maxdepth 1 -name '20*Z')
[ -n "$bk" ] && [ "$(echo "$bk" | wc -l)" = 1 ] || die "want one backup in /var/lib/holdfast-backup, found: $bk"
in_ct holdfast restore --verify-only "$bk" >"$work/verify.log" 2>&1 ||
	{ cat "$work/verify.log"; die "the backup of holdfast-backup.service does not verify"; }
in_ct grep -q "\"messages\": $((2 * N))," "$bk/manifest.json" ||
	die "the backup does not hold ORDERS' $((2 * N)) messages: $(in_ct cat "$bk/manifest.json")"
[ "$(in_ct stat -c '%U %a' "$bk")" = "holdfast 700" ] || die "backup dir owner/mode: $(in_ct stat -c '%U %a' "$bk")"
in_ct systemctl enable --now holdfast-backup.timer >/dev/null 2>&1 || die "enable --now holdfast-backup.timer"
[ "$(in_ct systemctl is-active holdfast-backup.timer)" = active ] || die "holdfast-backup.timer not active after enable --now"
# Backups are kept on purge on purpose: delete this one so that the purge
# check below sees only what the package owns.
in_ct rm -rf /var/lib/holdfast-backup
log "holdfast-backup: timer disabled after install; a run as holdfast in its sandbox wrote $bk ($((2 * N)) messages, verified); timer enabled"

# --- a reload with a broken config fails and changes nothing --------------
pid=$(prop MainPID)
in_ct cp /etc/holdfast/holdfast.toml /root/holdfast.toml.good
in_ct sh -c 'echo "this is not toml" >>/etc/holdfast/holdfast.toml'
if in_ct systemctl reload holdfast.service >"$work/reload.log" 2>&1; then
	die "systemctl reload with a broken config succeeded"
fi
in_ct cp /root/holdfast.toml.good /etc/holdfast/holdfast.toml
[ "$(prop ActiveState)" = active ] && [ "$(prop MainPID)" = "$pid" ] ||
	die "a failed reload changed the service: $(prop ActiveState), pid $(prop MainPID) (was $pid)"
in_ct systemctl reload holdfast.service || die "reload with the good config"
log "reload: a broken config is refused (systemctl reload fails), the service keeps running"

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
in_ct test ! -L /etc/systemd/system/timers.target.wants/holdfast-backup.timer || die "holdfast-backup.timer still enabled after remove"
in_ct test -d /var/lib/holdfast/jetstream || die "remove deleted the data"
in_ct test -f /etc/holdfast/holdfast.toml || die "remove deleted the conffile"
log "removed: stopped ($s), not enabled ($(in_ct systemctl is-enabled holdfast.service 2>/dev/null || true)), data and config kept"
in_ct apt-get install -y -q -o Dpkg::Options::=--force-confold /root/pkgs/v2.deb >"$work/apt.log" 2>&1 ||
	{ cat "$work/apt.log"; die "reinstall"; }
wait_active 60 || die "not active after reinstall"
[ "$(in_ct systemctl is-enabled holdfast.service)" = enabled ] || die "not enabled after reinstall"
expect_msgs "after reinstall" $((2 * N))

in_ct systemctl disable --now holdfast.service >/dev/null 2>&1
in_ct apt-get remove -y -q holdfast >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "remove (disabled)"; }
in_ct apt-get install -y -q -o Dpkg::Options::=--force-confold /root/pkgs/v2.deb >"$work/apt.log" 2>&1 ||
	{ cat "$work/apt.log"; die "reinstall (disabled)"; }
s=$(in_ct systemctl is-enabled holdfast.service || true)
[ "$s" = disabled ] || die "an admin's disable was lost across remove + reinstall: $s"
[ "$(prop ActiveState)" != active ] || die "a disabled service was started by the reinstall"
in_ct systemctl enable --now holdfast.service >/dev/null 2>&1 || die "enable --now"
wait_active 60 || die "not active after enable --now"
log "an admin's disable survives remove + reinstall"

# --- negative check: a unit that never becomes ready is a failure ---------
in_ct mkdir -p /run/systemd/system/holdfast.service.d
in_ct sh -c 'printf "[Service]\nExecStart=\nExecStart=/bin/sleep infinity\nTimeoutStartSec=3s\nRestart=no\n" >/run/systemd/system/holdfast.service.d/never-ready.conf'
in_ct systemctl daemon-reload
# Stopped first: right after a restart --no-block the old process may still
# be the active one when wait_active first looks.
in_ct systemctl stop holdfast.service
in_ct systemctl start --no-block holdfast.service
if wait_active 30; then
	die "negative check: a service that never sent READY=1 was reported active"
fi
log "negative check: a unit that never becomes ready is detected ($(prop Result))"
in_ct rm -r /run/systemd/system/holdfast.service.d
in_ct systemctl daemon-reload
in_ct systemctl reset-failed holdfast.service
in_ct systemctl start holdfast.service || die "start after the negative check"
wait_active 60 || die "not active after the negative check"

# --- systemctl stop while exec handlers run: they finish ------------------
# Each handler takes a few seconds; a stop must let them finish (up to
# shutdown_timeout) and ack, not kill them with holdfast (KillMode).
cat >"$root/usr/local/bin/slow-handler" <<'HANDLER'
#!/bin/sh
set -e
: >"/var/lib/holdfast/handler/$HOLDFAST_SEQ.started"
sleep 3
: >"/var/lib/holdfast/handler/$HOLDFAST_SEQ.done"
HANDLER
chmod 0755 "$root/usr/local/bin/slow-handler"
in_ct install -d -o holdfast -g holdfast -m 0750 /var/lib/holdfast/handler
in_ct sed -i -e 's|^handler = "log"|handler = "exec"|' \
	-e 's|^\[consumers\.WORKER1\.exec\].*|&\ncommand = ["/usr/local/bin/slow-handler"]|' /etc/holdfast/holdfast.toml
in_ct systemctl restart holdfast.service || die "restart with the exec handler"
wait_active 60 || die "not active with the exec handler"
handlers=3
nats_ pub -J -q --count "$handlers" orders.slow "slow {{Count}}" >/dev/null || die "publish for the exec handlers"
count() { in_ct find /var/lib/holdfast/handler -name "*.$1" | wc -l; }
deadline=$((SECONDS + 60))
until [ "$(count started)" -ge "$handlers" ]; do
	[ $SECONDS -lt $deadline ] || die "the exec handlers did not start: $(count started) of $handlers"
	sleep 0.2
done
since=$(in_ct date '+%Y-%m-%d %H:%M:%S')
stop_started=$SECONDS
in_ct systemctl stop holdfast.service || die "stop during exec"
stop_took=$((SECONDS - stop_started))
done_=$(count done)
stopped=$(in_ct journalctl --no-pager -u holdfast.service --since "$since" -o cat | grep -E 'workers stopped|handler failed' || true)
[ "$done_" = "$handlers" ] ||
	die "systemctl stop interrupted the exec handlers: $done_ of $handlers finished; log:"$'\n'"$stopped"
echo "$stopped" | grep -q 'workers stopped.*acked=[1-9]' ||
	die "no acks for the finished handlers in the log:"$'\n'"$stopped"
! echo "$stopped" | grep -q 'handler failed' || die "a handler failed during stop:"$'\n'"$stopped"
log "stop during exec: $handlers of $handlers handlers finished and were acked (stop took ${stop_took}s)"
in_ct systemctl start holdfast.service || die "start after the stop during exec"
wait_active 60 || die "not active after the stop during exec"

# --- purge ----------------------------------------------------------------
log "dpkg --purge holdfast"
in_ct dpkg --purge holdfast >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "purge"; }
s=$(in_ct systemctl is-active holdfast.service || true)
[ "$s" != active ] || die "still active after purge"
! in_ct test -e /var/lib/holdfast || die "purge left /var/lib/holdfast"
! in_ct test -e /etc/holdfast/holdfast.toml || die "purge left the config"
rm -f "$root/usr/local/bin/slow-handler"
in_ct sh -c "$file_list" >"$work/files.after"
purge_left "booted" "$work/files.before" "$work/files.after"
log "purged: stopped, /var/lib/holdfast and /etc/holdfast gone, no file left behind"

# --- a masked unit: the install succeeds and leaves it alone --------------
in_ct systemctl mask holdfast.service >/dev/null 2>&1
log "apt install ./v1.deb with holdfast.service masked"
in_ct apt-get install -y -q /root/pkgs/v1.deb >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "install with a masked unit"; }
[ "$(in_ct dpkg-query -W -f '${Status}' holdfast)" = "install ok installed" ] ||
	die "masked: package state $(in_ct dpkg-query -W -f '${Status}' holdfast)"
[ "$(in_ct systemctl is-enabled holdfast.service || true)" = masked ] || die "masked: the mask was removed"
[ "$(prop ActiveState)" != active ] || die "masked: the service was started"
in_ct systemctl unmask holdfast.service >/dev/null 2>&1
in_ct dpkg --purge holdfast >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "purge after masked"; }
log "masked unit: installed (configured), still masked, not started"

# --- policy-rc.d 101: the install succeeds and does not start it ----------
in_ct sh -c 'printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d'
log "apt install ./v1.deb with policy-rc.d exit 101"
in_ct apt-get install -y -q /root/pkgs/v1.deb >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "install with policy-rc.d"; }
in_ct rm -f /usr/sbin/policy-rc.d
[ "$(in_ct dpkg-query -W -f '${Status}' holdfast)" = "install ok installed" ] || die "policy-rc.d: not configured"
[ "$(prop ActiveState)" != active ] || die "policy-rc.d forbade the start, but the service was started"
[ "$(in_ct systemctl is-enabled holdfast.service)" = enabled ] || die "policy-rc.d: not enabled"
in_ct dpkg --purge holdfast >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "purge after policy-rc.d"; }
in_ct sh -c "$file_list" >"$work/files.after"
purge_left "masked and policy-rc.d" "$work/files.before" "$work/files.after"
log "policy-rc.d 101: installed and enabled, not started; purged without a trace"

# --- upgrade from the package of an older commit --------------------------
# upgrade_from_old deb|rpm: installs the package $v0 of $old_commit on a
# system without holdfast, publishes $old_n messages that it processes (log
# handler), stops WORKER1 (workers = 0: a modified conffile) and publishes
# $old_m more, then upgrades to $v2, which must keep the config, the
# messages, the stream's last sequence and WORKER1's ack floor, and run.
# Then WORKER1 gets an exec handler that records each message's sequence and
# delivery count: exactly old_n+1..old_n+old_m must be handled, none below the
# ack floor, each once as a first delivery; any further line is an
# at-least-once redelivery (delivery > 1), counted.
old_n=$N old_m=$(((N + 1) / 2))
upgrade_from_old() {
	local kind=$1 total=$((old_n + old_m)) last pid handled distinct dups want
	in_ct rm -rf /var/lib/holdfast /etc/holdfast
	log "$kind: install $v0, the package of ${old_commit:0:7}"
	case $kind in
	deb) in_ct apt-get install -y -q /root/pkgs/old.deb ;;
	rpm) in_ct rpm -i --nodeps /root/pkgs/old.rpm ;;
	esac >"$work/old.log" 2>&1 || { cat "$work/old.log"; die "$kind: install of $v0"; }
	wait_active 60 || die "$kind: $v0 not active after install"
	publish "$old_n" || die "$kind: publish to $v0"
	expect_worker1 "$kind: $v0 processed $old_n" "$old_n" 0
	[ "$(in_ct grep -c '^workers = 4 ' /etc/holdfast/holdfast.toml)" = 1 ] ||
		die "$kind: the config of $v0 has not exactly one 'workers = 4' line"
	in_ct sed -i 's/^workers = 4 /workers = 0 /' /etc/holdfast/holdfast.toml
	in_ct systemctl restart holdfast.service || die "$kind: restart of $v0 with workers = 0"
	wait_active 60 || die "$kind: $v0 not active with workers = 0"
	publish "$old_m" || die "$kind: publish to $v0 with workers = 0"
	expect_msgs "$kind: $v0 with WORKER1 stopped" "$total"
	expect_worker1 "$kind: $v0 with WORKER1 stopped" "$old_n" "$old_m"
	last=$(stream_last_seq)
	pid=$(prop MainPID)

	log "$kind: upgrade $v0 -> $v2"
	case $kind in
	deb) in_ct apt-get install -y -q -o Dpkg::Options::=--force-confold /root/pkgs/v2.deb ;;
	rpm) in_ct rpm -U --nodeps /root/pkgs/v2.rpm ;;
	esac >"$work/old.log" 2>&1 || { cat "$work/old.log"; die "$kind: upgrade from $v0 to $v2"; }
	case $kind in
	deb) [ "$(in_ct dpkg-query -W -f '${Version}' holdfast)" = "$v2-1" ] ;;
	rpm) [ "$(in_ct rpm -q --qf '%{VERSION}' holdfast)" = "$v2" ] ;;
	esac || die "$kind: version after the upgrade from $v0"
	in_ct grep -q '^workers = 0 ' /etc/holdfast/holdfast.toml || die "$kind: the upgrade from $v0 replaced the modified config"
	wait_active 60 || die "$kind: not active after the upgrade from $v0"
	[ "$(prop MainPID)" != "$pid" ] || die "$kind: the upgrade from $v0 did not restart the service"
	[ "$(in_ct systemctl is-enabled holdfast.service)" = enabled ] || die "$kind: not enabled after the upgrade from $v0"
	expect_msgs "$kind: after the upgrade from $v0 (modified config kept)" "$total"
	[ "$(stream_last_seq)" = "$last" ] || die "$kind: last sequence $(stream_last_seq) after the upgrade from $v0, was $last"
	expect_worker1 "$kind: after the upgrade from $v0 (last sequence $last kept)" "$old_n" "$old_m"

	# The exec handler, as in "systemctl stop while exec handlers run": the
	# unit's sandbox lets it write under /var/lib/holdfast only.
	cat >"$root/usr/local/bin/record-seq" <<'HANDLER'
#!/bin/sh
echo "$HOLDFAST_SEQ $HOLDFAST_DELIVERY" >>/var/lib/holdfast/handled/seqs
HANDLER
	chmod 0755 "$root/usr/local/bin/record-seq"
	in_ct install -d -o holdfast -g holdfast -m 0750 /var/lib/holdfast/handled
	in_ct sed -i -e 's|^handler = "log"|handler = "exec"|' -e 's|^workers = 0 |workers = 4 |' \
		-e 's|^\[consumers\.WORKER1\.exec\].*|&\ncommand = ["/usr/local/bin/record-seq"]|' /etc/holdfast/holdfast.toml
	in_ct systemctl restart holdfast.service || die "$kind: restart with the exec handler"
	wait_active 60 || die "$kind: not active with the exec handler"
	expect_worker1 "$kind: exec handler after the upgrade" "$total" 0
	in_ct cat /var/lib/holdfast/handled/seqs >"$work/seqs" || die "$kind: no sequence recorded by the exec handler"
	handled=$(wc -l <"$work/seqs")
	distinct=$(cut -d' ' -f1 "$work/seqs" | sort -nu | wc -l)
	want=$(seq $((old_n + 1)) "$total")
	[ "$(cut -d' ' -f1 "$work/seqs" | sort -nu)" = "$want" ] ||
		die "$kind: after the upgrade from $v0 the exec handler saw $distinct distinct sequences from $(sort -n "$work/seqs" | head -1) to $(sort -n "$work/seqs" | tail -1), want exactly $((old_n + 1))..$total"
	! awk 'NF != 2 || $2 !~ /^[1-9][0-9]*$/ { bad = 1 } END { exit !bad }' "$work/seqs" ||
		die "$kind: a line of the exec handler's record is not 'SEQ DELIVERY': $(grep -v -m1 -E '^[0-9]+ [1-9][0-9]*$' "$work/seqs")"
	dups=$(awk '$2 == 1' "$work/seqs" | cut -d' ' -f1 | sort -n | uniq -d | head -5)
	[ -z "$dups" ] || die "$kind: sequences handled twice as a first delivery (reprocessed, not redelivered): $dups"
	log "$kind: the exec handler handled exactly $((old_n + 1))..$total after the upgrade, nothing below the ack floor; $((handled - distinct)) at-least-once redeliveries"
	rm -f "$root/usr/local/bin/record-seq"
}
if [ -z "$old_skip" ]; then
	upgrade_from_old deb
	log "dpkg --purge holdfast"
	in_ct dpkg --purge holdfast >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; die "purge after the upgrade from $v0"; }
	in_ct sh -c "$file_list" >"$work/files.after"
	purge_left "upgrade from $v0" "$work/files.before" "$work/files.after"
	log "deb: upgraded from $v0 and purged without a trace"
fi

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
! in_ct test -e /etc/systemd/system/multi-user.target.wants/holdfast.service || die "rpm -e left the service enabled"
in_ct test -d /var/lib/holdfast/jetstream || die "rpm -e deleted the data"
log "rpm: installed, active, restarted without loss, erased (stopped, disabled, data kept)"

# --- rpm: a masked unit does not fail the install -------------------------
in_ct rm -rf /var/lib/holdfast /etc/holdfast
in_ct systemctl mask holdfast.service >/dev/null 2>&1
in_ct rpm -i --nodeps /root/pkgs/v1.rpm >"$work/rpm.log" 2>&1 || { cat "$work/rpm.log"; die "rpm -i with a masked unit"; }
[ "$(prop ActiveState)" != active ] || die "rpm: a masked unit was started"
in_ct systemctl unmask holdfast.service >/dev/null 2>&1
in_ct rpm -e holdfast >"$work/rpm.log" 2>&1 || { cat "$work/rpm.log"; die "rpm -e after masked"; }
log "rpm: a masked unit is installed, not started"

# --- rpm: upgrade from the package of an older commit ---------------------
if [ -z "$old_skip" ]; then
	upgrade_from_old rpm
	in_ct rpm -e holdfast >"$work/rpm.log" 2>&1 || { cat "$work/rpm.log"; die "rpm -e after the upgrade from $v0"; }
	log "rpm: upgraded from $v0 with rpm -U, erased"
fi

# --- piuparts, started above ------------------------------------------------
if [ -n "$piuparts_pid" ]; then
	piuparts_rc=0
	wait "$piuparts_pid" || piuparts_rc=$?
	piuparts_pid=
	[ "$piuparts_rc" = 0 ] ||
		{ grep -v 'by /usr merge' "$work/piuparts.log" | tail -40; die "piuparts (exit $piuparts_rc)"; }
	log "piuparts: $(grep -o 'PASS: .*' "$work/piuparts.log" | tr '\n' ' ')"
fi
