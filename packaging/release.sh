#!/bin/sh
# Release artefacts from what packaging/build.sh left in dist/ (called by
# `make release`, after `make package`), or in $HOLDFAST_DIST:
#
#   packaging/release.sh
#
# For each architecture built: holdfast-VERSION-linux-ARCH.tar.gz holding
# the static binary, the default config, the manual page, the bash
# completion, LICENSE and the third-party licence notices (the same files
# the packages install); then SHA256SUMS over those tarballs and the deb
# and rpm packages, checked with sha256sum -c before it ends. The tarballs
# are reproducible: sorted, numeric owner 0, every mtime SOURCE_DATE_EPOCH.
set -eu

cd "$(dirname "$0")/.."
dist=${HOLDFAST_DIST:-dist}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

# The package version, from the deb's name: holdfast_VERSION-1_ARCH.deb.
deb=$(ls "$dist"/holdfast_*.deb 2>/dev/null | head -1)
[ -n "$deb" ] || { echo "release.sh: no holdfast_*.deb in $dist: run make package first" >&2; exit 2; }
version=$(basename "$deb" | sed 's/^holdfast_\(.*\)-1_[a-z0-9]*\.deb$/\1/')

rm -f "$dist"/holdfast-*-linux-*.tar.gz "$dist/SHA256SUMS"
for dir in "$dist"/build/*/; do
	arch=$(basename "$dir")
	[ "$arch" != host ] || continue
	name=holdfast-$version-linux-$arch
	stage=$dist/build/stage/$name
	rm -rf "$stage"
	mkdir -p "$stage"
	cp "$dir/holdfast" "$dir/holdfast.toml" "$dir/holdfast.1.gz" "$dir/holdfast.bash" \
		"$dir/third-party-licenses" LICENSE "$stage/"
	touch -d "@$SOURCE_DATE_EPOCH" "$stage" "$stage"/*
	tar -C "$dist/build/stage" --sort=name --mtime="@$SOURCE_DATE_EPOCH" \
		--owner=0 --group=0 --numeric-owner -cf - "$name" | gzip -9n >"$dist/$name.tar.gz"
	rm -rf "$stage"
	echo "release: $dist/$name.tar.gz"
done
rmdir "$dist/build/stage" 2>/dev/null || true

(
	cd "$dist"
	sha256sum holdfast-*-linux-*.tar.gz holdfast_*.deb holdfast-*.rpm >SHA256SUMS
	sha256sum --quiet -c SHA256SUMS
)
echo "release: $dist/SHA256SUMS ($(wc -l <"$dist/SHA256SUMS") files, checked)"
