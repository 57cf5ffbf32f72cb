#!/bin/sh
# Prints the deb/rpm package version for a build (called by build.sh).
#
#   packaging/version.sh VERSION COMMIT COMMIT_TIME
#
# VERSION is `git describe --tags --always --dirty`, COMMIT the short hash,
# COMMIT_TIME the commit's time in seconds since the epoch (UTC).
#   v1.2.3              -> 1.2.3
#   v1.2.3-rc1          -> 1.2.3~rc1 (sorts before 1.2.3)
#   v1.2.3-4-gabc1234   -> 1.2.3+4.gabc1234 (4 commits after the tag)
#   abc1234 (no tag)    -> 0.0.0~git20250101.153045.abc1234
# An untagged build sorts before any release and, by its commit time (date,
# then time of day), after the snapshots made before it: the hash comes last
# and only tells two commits of the same second apart. A tree with
# uncommitted changes (-dirty) is refused: its packages could not be told
# apart from the commit's.
set -eu

[ $# -eq 3 ] || { echo "usage: $0 VERSION COMMIT COMMIT_TIME" >&2; exit 2; }
version=$1 commit=$2 time=$3

case $version in
*-dirty)
	echo "refusing to package a tree with uncommitted changes ($version):" \
		"commit or stash them, or give the package version (make package PKG_VERSION=...)" >&2
	exit 1
	;;
esac
case $time in
'' | *[!0-9]*) echo "commit time must be seconds since the epoch: '$time'" >&2; exit 2 ;;
esac

case $version in
v[0-9]*) pkg=$(echo "${version#v}" | sed -e 's/-\([0-9][0-9]*\)-g/+\1.g/' -e 's/-/~/g') ;;
*) pkg=0.0.0~git$(date -u -d "@$time" +%Y%m%d.%H%M%S).$(echo "$commit" | tr -c 'a-zA-Z0-9.\n' '.') ;;
esac
case $pkg in
[0-9]*) ;;
*) echo "package version must start with a digit: $pkg" >&2; exit 2 ;;
esac
echo "$pkg"
