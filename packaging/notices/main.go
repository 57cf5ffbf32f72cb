// Command notices writes the third-party licence notices of a Go binary:
// for every module linked into it (its build info, as `go version -m`
// prints it) and for the Go standard library, the licence, notice and patent
// files of that module version from the module cache, in full. packaging/
// build.sh ships its output as /usr/share/doc/holdfast/third-party-licenses
// (deb) and in /usr/share/licenses/holdfast/ (rpm).
//
//	go run ./packaging/notices -goroot "$(go env GOROOT)" -modcache "$(go env GOMODCACHE)" BINARY
//
// It fails when a module version is not in the module cache (go mod
// download fetches it) or has no licence file at its root, so that no module
// ships without its notice.
package main

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"
)

func main() {
	goroot := flag.String("goroot", "", "GOROOT of the Go that built the binary (go env GOROOT)")
	modcache := flag.String("modcache", "", "module cache holding the binary's modules (go env GOMODCACHE)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: notices -goroot DIR -modcache DIR BINARY")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || *goroot == "" || *modcache == "" {
		flag.Usage()
		os.Exit(2)
	}
	out, err := notices(flag.Arg(0), *goroot, *modcache)
	if err != nil {
		fmt.Fprintln(os.Stderr, "notices:", err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}

// module is one entry of the notices file.
type module struct {
	path, version string
	dir           string   // where its files are
	files         []string // licence files, relative to dir, root ones first
	licence       string   // SPDX identifier of the root licence, or "see below"
}

func notices(binary, goroot, modcache string) ([]byte, error) {
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	mods := []*module{{path: "std", version: bi.GoVersion, dir: goroot}}
	for _, dep := range bi.Deps {
		m := dep
		if dep.Replace != nil {
			m = dep.Replace
		}
		if m.Version == "" {
			return nil, fmt.Errorf("%s is replaced by the directory %s: its licence cannot be found in the module cache", dep.Path, m.Path)
		}
		dir, err := moduleDir(modcache, m)
		if err != nil {
			return nil, err
		}
		mods = append(mods, &module{path: dep.Path, version: m.Version, dir: dir})
	}
	for _, m := range mods {
		if err := m.findFiles(); err != nil {
			return nil, err
		}
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "Third-party software in %s\n\n", bi.Path)
	b.WriteString("This program is statically linked: besides its own code (see the file\n")
	b.WriteString("copyright) it contains the Go standard library and the Go modules listed\n")
	b.WriteString("below, in the version linked in. The licence, notice and patent files of\n")
	b.WriteString("each follow in full, as published with that version.\n\n")
	for _, m := range mods {
		fmt.Fprintf(&b, "  %-48s %-36s %s\n", m.path, m.version, m.licence)
	}
	for _, m := range mods {
		b.WriteString("\n" + strings.Repeat("=", 78) + "\n")
		fmt.Fprintf(&b, "Module: %s %s\n", m.path, m.version)
		fmt.Fprintf(&b, "Licence: %s\n", m.licence)
		for _, f := range m.files {
			text, err := os.ReadFile(filepath.Join(m.dir, f))
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(&b, "\n--- %s %s: %s ---\n\n", m.path, m.version, filepath.ToSlash(f))
			b.Write(bytes.TrimRight(text, "\n\r\t "))
			b.WriteString("\n")
		}
	}
	return b.Bytes(), nil
}

// moduleDir is the extracted module in the module cache.
func moduleDir(modcache string, m *debug.Module) (string, error) {
	dir := filepath.Join(modcache, escape(m.Path)+"@"+escape(m.Version))
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%s %s is not in the module cache %s: run go mod download", m.Path, m.Version, modcache)
	}
	return dir, nil
}

// escape is the module cache's case encoding: an upper-case letter is "!"
// and the letter in lower case (golang.org/x/mod/module.EscapePath).
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

var licenceName = regexp.MustCompile(`(?i)^(licen[cs]e|copying|notice|patents)([.\-_].*)?$`)

// findFiles collects the licence files: those at the module's root, then
// those of code it carries in subdirectories (vendored or derived code with
// its own licence). Test data and the Go tree's own tests are skipped.
func (m *module) findFiles() error {
	var root, nested []string
	err := filepath.WalkDir(m.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(m.dir, path)
		if d.IsDir() {
			name := d.Name()
			if path != m.dir && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if m.path == "std" && path != m.dir {
				// GOROOT: only its LICENSE and PATENTS; the code it
				// vendors under src/vendor is Go's, under the same licence.
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !licenceName.MatchString(d.Name()) {
			return nil
		}
		if filepath.Dir(rel) == "." {
			root = append(root, rel)
		} else {
			nested = append(nested, rel)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(root)
	sort.Strings(nested)
	m.files = append(root, nested...)
	var main []byte
	for _, f := range root {
		if strings.HasPrefix(strings.ToUpper(f), "LICEN") || strings.HasPrefix(strings.ToUpper(f), "COPYING") {
			if main, err = os.ReadFile(filepath.Join(m.dir, f)); err != nil {
				return err
			}
			break
		}
	}
	if main == nil {
		return errors.New(m.path + " " + m.version + ": no LICENSE or COPYING file at the module's root in " + m.dir)
	}
	m.licence = identify(main)
	return nil
}

// identify names the licences in a licence file by their SPDX identifiers
// (a file may hold several), for the summary only: the texts themselves are
// what is shipped.
func identify(text []byte) string {
	t := strings.Join(strings.Fields(string(text)), " ")
	has := func(s string) bool { return strings.Contains(t, s) }
	var ids []string
	if has("Apache License") && has("Version 2.0") {
		ids = append(ids, "Apache-2.0")
	}
	if has("Mozilla Public License Version 2.0") {
		ids = append(ids, "MPL-2.0")
	}
	if has("Permission is hereby granted, free of charge") {
		ids = append(ids, "MIT")
	}
	if has("Permission to use, copy, modify, and/or distribute this software") {
		ids = append(ids, "ISC")
	}
	if has("Redistribution and use in source and binary forms") {
		if has("Neither the name") || has("names of its contributors") || has("name of the copyright holder") {
			ids = append(ids, "BSD-3-Clause")
		} else {
			ids = append(ids, "BSD-2-Clause")
		}
	}
	if len(ids) == 0 {
		return "see below"
	}
	return strings.Join(ids, " AND ")
}
