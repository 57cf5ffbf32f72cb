// Package packaging holds the static checks of the systemd unit and of the
// deb and rpm packages built by packaging/build.sh (make package). The real
// install under systemd is packaging/install-test.sh (make install-test).
package packaging

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-io/holdfast/config"
)

const (
	unitPath     = "../systemd/holdfast.service"
	sysusersPath = "../systemd/holdfast.sysusers"
	// maxExposure is the highest acceptable `systemd-analyze security` score.
	maxExposure = 2.5
	// packagedStoreDir is the store dir written into the packaged config.
	packagedStoreDir = "/var/lib/holdfast"
)

// needTool skips the test when a command-line tool is not installed. CI
// (.ci/run) installs all of them, so there these tests never skip.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed (apt-get install %s); .ci/run installs it", name, pkg)
	}
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// unitFile parses a systemd unit into section -> key -> values (in order).
func unitFile(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: not key=value: %q", path, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// verifiableUnit writes the unit with /usr/bin/holdfast replaced by an
// executable that exists here, so systemd-analyze can check the Exec lines.
func verifiableUnit(t *testing.T) string {
	t.Helper()
	text, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	bin, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "holdfast.service")
	text = bytes.ReplaceAll(text, []byte("/usr/bin/holdfast"), []byte(bin))
	if err := os.WriteFile(path, text, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestUnitContract(t *testing.T) {
	u := unitFile(t, unitPath)
	svc := u["Service"]
	want := map[string]string{
		"Type":                    "notify",
		"User":                    "holdfast",
		"Group":                   "holdfast",
		"ExecStartPre":            "/usr/bin/holdfast check",
		"ExecStart":               "/usr/bin/holdfast run",
		"KillMode":                "mixed",
		"StateDirectory":          "holdfast",
		"ConfigurationDirectory":  "holdfast",
		"Restart":                 "on-failure",
		"ProtectSystem":           "strict",
		"ProtectHome":             "true",
		"PrivateTmp":              "true",
		"PrivateDevices":          "true",
		"NoNewPrivileges":         "true",
		"CapabilityBoundingSet":   "",
		"MemoryDenyWriteExecute":  "true",
		"UMask":                   "0077",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
	}
	for k, v := range want {
		got := svc[k]
		if len(got) != 1 || got[0] != v {
			t.Errorf("[Service] %s = %q, want %q", k, got, v)
		}
	}
	if got := u["Install"]["WantedBy"]; len(got) != 1 || got[0] != "multi-user.target" {
		t.Errorf("[Install] WantedBy = %q, want multi-user.target", got)
	}
	// A reload checks the file first, so that a broken config fails
	// `systemctl reload` instead of being reported as reloaded; holdfast
	// reload then fails it when the reload is refused.
	if got := svc["ExecReload"]; len(got) != 2 || got[0] != "/usr/bin/holdfast check" || got[1] != "/usr/bin/holdfast reload --pid $MAINPID" {
		t.Errorf("[Service] ExecReload = %q, want holdfast check, then holdfast reload --pid $MAINPID", got)
	}
	if f := svc["SystemCallFilter"]; len(f) == 0 || f[0] != "@system-service" {
		t.Errorf("SystemCallFilter = %q, want @system-service first", f)
	}

	sec := func(k string) time.Duration {
		t.Helper()
		v := svc[k]
		if len(v) != 1 {
			t.Fatalf("[Service] %s = %q, want one value", k, v)
		}
		d, err := time.ParseDuration(strings.ReplaceAll(strings.ReplaceAll(v[0], "min", "m"), " ", ""))
		if err != nil {
			t.Fatalf("[Service] %s = %q: %v", k, v[0], err)
		}
		return d
	}
	// The stop timeout must leave room for the drain plus closing the store.
	drain := config.DefaultConfig().Run.ShutdownTimeout.Duration
	if stop := sec("TimeoutStopSec"); stop < drain+10*time.Second {
		t.Errorf("TimeoutStopSec = %v, want at least shutdown_timeout (%v) + 10s", stop, drain)
	}
	if start := sec("TimeoutStartSec"); start < 5*time.Minute {
		t.Errorf("TimeoutStartSec = %v, want at least 5m for recovering a full store", start)
	}
	if wd := sec("WatchdogSec"); wd < 10*time.Second {
		t.Errorf("WatchdogSec = %v, want at least 10s", wd)
	}
	if n, err := strconv.Atoi(strings.Join(svc["LimitNOFILE"], "")); err != nil || n < 4096 {
		t.Errorf("LimitNOFILE = %q, want a number >= 4096", svc["LimitNOFILE"])
	}
}

// verifyArgs run systemd-analyze verify without its man page check: it
// runs man(1) for Documentation=man:holdfast(1), which finds the page only
// where the package is installed (and fails where man-db is installed but
// the page is not). The package's contents test checks that it ships the
// page.
var verifyArgs = []string{"verify", "--man=no"}

func TestUnitVerify(t *testing.T) {
	sa := needTool(t, "systemd-analyze", "systemd")
	out, err := exec.Command(sa, append(verifyArgs, verifiableUnit(t))...).CombinedOutput()
	if err != nil || len(out) > 0 {
		// verify exits 0 on unknown keys and the like: any output is a failure.
		t.Fatalf("systemd-analyze verify: err=%v, output:\n%s", err, out)
	}
}

func TestUnitSecurityScore(t *testing.T) {
	sa := needTool(t, "systemd-analyze", "systemd")
	// --threshold is on a 0-100 scale; the printed score on 0-10.
	out := run(t, sa, "security", "--offline=true", "--no-pager",
		fmt.Sprintf("--threshold=%d", int(maxExposure*10)), verifiableUnit(t))
	m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	score, _ := strconv.ParseFloat(m[1], 64)
	t.Logf("systemd-analyze security exposure: %.1f", score)
	if score > maxExposure {
		t.Fatalf("exposure %.1f > %.1f:\n%s", score, maxExposure, out)
	}
}

// The preinstall script creates the user before the sysusers file is
// unpacked, with the same line.
func TestSysusersMatchesPreinstall(t *testing.T) {
	su, err := os.ReadFile(sysusersPath)
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(string(su), "\n") {
		if strings.HasPrefix(l, "u ") {
			line = l
		}
	}
	if !strings.HasPrefix(line, "u holdfast ") {
		t.Fatalf("%s: no 'u holdfast' line", sysusersPath)
	}
	pre, err := os.ReadFile("scripts/preinstall.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(pre), "'"+line+"'") {
		t.Errorf("scripts/preinstall.sh does not create the user with %q", line)
	}
}

// The maintainer scripts are plain POSIX sh, and systemctl is only used
// behind the running-systemd guard.
func TestMaintainerScripts(t *testing.T) {
	shells := []string{"sh"}
	if _, err := exec.LookPath("dash"); err == nil {
		shells = append(shells, "dash")
	}
	for _, name := range []string{"preinstall.sh", "postinstall.sh", "preremove.sh", "postremove.sh"} {
		path := filepath.Join("scripts", name)
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(text, []byte("#!/bin/sh\n")) {
			t.Errorf("%s: want #!/bin/sh", path)
		}
		for _, sh := range shells {
			if out, err := exec.Command(sh, "-n", path).CombinedOutput(); err != nil {
				t.Errorf("%s -n %s: %v\n%s", sh, path, err, out)
			}
		}
		guarded := false
		for i, l := range strings.Split(string(text), "\n") {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "#") {
				continue
			}
			if strings.Contains(l, "[ -d /run/systemd/system ]") {
				guarded = true
			}
			if strings.Contains(l, "systemctl ") && !guarded {
				t.Errorf("%s:%d: systemctl before the [ -d /run/systemd/system ] guard", path, i+1)
			}
			// Under set -e a failing enable (masked unit), daemon-reload or
			// start must not fail the install: each call is tested or
			// followed by || true.
			if mayFail.MatchString(l) && !strings.Contains(l, "|| true") &&
				!strings.HasPrefix(l, "if ") && !strings.HasPrefix(l, "elif ") && !strings.Contains(l, "|| rc=") {
				t.Errorf("%s:%d: %q can fail the install (a masked unit, no systemd): test it or add || true", path, i+1, l)
			}
		}
	}
}

var mayFail = regexp.MustCompile(`(^|[;&|] *)(systemctl|deb-systemd-helper|deb-systemd-invoke|\$invoke) `)

// fakeTools puts stand-ins for the named commands in a directory that logs
// each call's arguments to the file log, and returns the directory.
func fakeTools(t *testing.T, log string, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		script := "#!/bin/sh\necho \"" + n + " $*\" >>" + log + "\nexit 0\n"
		if err := os.WriteFile(filepath.Join(dir, n), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Removal in a chroot or an image build (no systemd running) must still
// delete the enablement symlink, or purge leaves it behind (piuparts:
// "Package purging left files on system"). Without deb-systemd-helper (rpm)
// preremove disables the unit with systemctl --no-reload; with it (Debian),
// postremove's purge does.
func TestPreremoveDisablesWithoutRunningSystemd(t *testing.T) {
	for _, arg := range []string{"0", "remove"} {
		log := filepath.Join(t.TempDir(), "calls")
		cmd := exec.Command("/bin/sh", "scripts/preremove.sh", arg)
		// Only the fake systemctl on PATH: no deb-systemd-helper, as on
		// an rpm system.
		cmd.Env = []string{"PATH=" + fakeTools(t, log, "systemctl")}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("preremove.sh %s: %v\n%s", arg, err, out)
		}
		calls, _ := os.ReadFile(log)
		if !strings.Contains(string(calls), "systemctl --no-reload disable holdfast.service\n") {
			t.Errorf("preremove.sh %s did not run systemctl --no-reload disable holdfast.service; calls:\n%s", arg, calls)
		}
		if !strings.Contains(string(calls), "systemctl --no-reload disable holdfast-backup.timer\n") {
			t.Errorf("preremove.sh %s did not run systemctl --no-reload disable holdfast-backup.timer; calls:\n%s", arg, calls)
		}
	}
	post, err := os.ReadFile("scripts/postremove.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(post), `deb-systemd-helper purge "$unit"`) {
		t.Error("scripts/postremove.sh does not run deb-systemd-helper purge on purge")
	}
}

// built holds the packages of one build.sh run for this machine's architecture.
type built struct {
	dir, deb, rpm, arch string
}

var (
	buildOnce sync.Once
	buildOut  built
	buildErr  error
)

const testPkgVersion = "1.2.3~test"

var buildArgs = []string{"./build.sh", "v1.2.3-test", "0000000", testPkgVersion, runtime.GOARCH}

// buildEnv: a fixed mtime, so that a commit made while the tests run changes
// nothing.
func buildEnv(dist string) []string {
	return append(os.Environ(), "HOLDFAST_DIST="+dist, "SOURCE_DATE_EPOCH=1700000000")
}

func buildPackages(dist string) error {
	cmd := exec.Command(buildArgs[0], buildArgs[1:]...)
	cmd.Env = buildEnv(dist)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build.sh: %v\n%s", err, out)
	}
	return nil
}

// packages builds the deb and the rpm once per test binary.
func packages(t *testing.T) built {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the packages: skipped with -short")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "holdfast-packaging-test")
		if err != nil {
			buildErr = err
			return
		}
		if buildErr = buildPackages(dir); buildErr != nil {
			return
		}
		debs, _ := filepath.Glob(filepath.Join(dir, "holdfast_*.deb"))
		rpms, _ := filepath.Glob(filepath.Join(dir, "holdfast-*.rpm"))
		if len(debs) != 1 || len(rpms) != 1 {
			buildErr = fmt.Errorf("want one deb and one rpm in %s, got %q %q", dir, debs, rpms)
			return
		}
		buildOut = built{dir: dir, deb: debs[0], rpm: rpms[0], arch: runtime.GOARCH}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildOut
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildOut.dir != "" {
		os.RemoveAll(buildOut.dir)
	}
	os.Exit(code)
}

// wantFiles are the packaged files: path -> mode, owner:group.
var wantFiles = map[string][2]string{
	"/usr/bin/holdfast":                                   {"-rwxr-xr-x", "root:root"},
	"/etc/holdfast":                                       {"drwxr-x---", "root:holdfast"},
	"/etc/holdfast/holdfast.toml":                         {"-rw-r-----", "root:holdfast"},
	"/usr/lib/systemd/system/holdfast.service":            {"-rw-r--r--", "root:root"},
	"/usr/lib/systemd/system/holdfast-backup.service":     {"-rw-r--r--", "root:root"},
	"/usr/lib/systemd/system/holdfast-backup.timer":       {"-rw-r--r--", "root:root"},
	"/usr/lib/sysusers.d/holdfast.conf":                   {"-rw-r--r--", "root:root"},
	"/usr/share/man/man1/holdfast.1.gz":                   {"-rw-r--r--", "root:root"},
	"/usr/share/bash-completion/completions/holdfast":     {"-rw-r--r--", "root:root"},
	"/usr/share/doc/holdfast/examples/handler-needs.conf": {"-rw-r--r--", "root:root"},
	"/usr/share/holdfast/grafana/holdfast.json":           {"-rw-r--r--", "root:root"},
	"/usr/share/holdfast/prometheus/holdfast-rules.yml":   {"-rw-r--r--", "root:root"},
}

func TestDebContents(t *testing.T) {
	needTool(t, "dpkg-deb", "dpkg")
	p := packages(t)
	if got, want := filepath.Base(p.deb), "holdfast_"+testPkgVersion+"-1_"+p.arch+".deb"; got != want {
		t.Errorf("deb file name %s, want %s", got, want)
	}

	files := map[string][2]string{}
	for _, l := range strings.Split(strings.TrimSpace(run(t, "dpkg-deb", "-c", p.deb)), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb -c line: %q", l)
		}
		files[strings.TrimSuffix(strings.TrimPrefix(f[len(f)-1], "."), "/")] = [2]string{f[0], strings.ReplaceAll(f[1], "/", ":")}
	}
	for path, want := range wantFiles {
		if got, ok := files[path]; !ok {
			t.Errorf("deb lacks %s", path)
		} else if got != want {
			t.Errorf("deb %s: %v, want %v", path, got, want)
		}
	}
	for _, path := range []string{"/usr/share/doc/holdfast/copyright", "/usr/share/doc/holdfast/changelog.Debian.gz", "/usr/share/lintian/overrides/holdfast", "/usr/share/doc/holdfast/third-party-licenses"} {
		if _, ok := files[path]; !ok {
			t.Errorf("deb lacks %s", path)
		}
	}

	info := run(t, "dpkg-deb", "-I", p.deb)
	for _, want := range []string{
		"Package: holdfast", "Version: " + testPkgVersion + "-1", "Architecture: " + p.arch,
		"Maintainer: ", "Description: durable message appliance", "Section: ", "Homepage: ",
		"preinst", "postinst", "prerm", "postrm", "conffiles",
	} {
		if !strings.Contains(info, want) {
			t.Errorf("dpkg-deb -I lacks %q:\n%s", want, info)
		}
	}
	// Static binary: no dependency.
	if got := strings.TrimSpace(run(t, "dpkg-deb", "-f", p.deb, "Depends")); got != "" {
		t.Errorf("Depends = %q, want none", got)
	}
	// preinst runs useradd (passwd, not essential) when systemd-sysusers is
	// missing, before the package is unpacked.
	if got := strings.TrimSpace(run(t, "dpkg-deb", "-f", p.deb, "Pre-Depends")); got != "passwd" {
		t.Errorf("Pre-Depends = %q, want passwd", got)
	}
	ctrl := t.TempDir()
	run(t, "dpkg-deb", "-e", p.deb, ctrl)
	conffiles, err := os.ReadFile(filepath.Join(ctrl, "conffiles"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(conffiles)) != "/etc/holdfast/holdfast.toml" {
		t.Errorf("conffiles = %q, want only /etc/holdfast/holdfast.toml", conffiles)
	}
	for script, src := range map[string]string{"preinst": "preinstall.sh", "postinst": "postinstall.sh", "prerm": "preremove.sh", "postrm": "postremove.sh"} {
		got, _ := os.ReadFile(filepath.Join(ctrl, script))
		want, _ := os.ReadFile(filepath.Join("scripts", src))
		if !bytes.Equal(got, want) {
			t.Errorf("deb %s is not scripts/%s", script, src)
		}
	}

	// The packaged config is `holdfast config` output for the packaged store.
	root := t.TempDir()
	run(t, "dpkg-deb", "-x", p.deb, root)
	gotConf, err := os.ReadFile(filepath.Join(root, "etc/holdfast/holdfast.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var wantConf bytes.Buffer
	if err := config.WriteDefault(&wantConf, packagedStoreDir); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gotConf, wantConf.Bytes()) {
		t.Errorf("packaged holdfast.toml is not the default config with store_dir %s", packagedStoreDir)
	}
	checkBinary(t, filepath.Join(root, "usr/bin/holdfast"))
}

// checkBinary: static (no ELF interpreter), stripped (no symbol table).
func checkBinary(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked", path)
		}
	}
	if f.Section(".symtab") != nil {
		t.Errorf("%s is not stripped (.symtab present)", path)
	}
}

func TestDebLintian(t *testing.T) {
	needTool(t, "lintian", "lintian")
	p := packages(t)
	// Every deliberate exception is in packaging/lintian-overrides, with its
	// reason; anything else, even a warning, fails.
	cmd := exec.Command("lintian", "--fail-on", "error,warning", p.deb)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("lintian: %v\n%s", err, out)
	}
	if s := strings.TrimSpace(strings.ReplaceAll(string(out), "running with root privileges is not recommended!", "")); s != "" {
		t.Logf("lintian:\n%s", s)
	}
}

func TestRPMContents(t *testing.T) {
	needTool(t, "rpm", "rpm")
	p := packages(t)
	rpmArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[p.arch]
	if got, want := filepath.Base(p.rpm), "holdfast-"+testPkgVersion+"-1."+rpmArch+".rpm"; got != want {
		t.Errorf("rpm file name %s, want %s", got, want)
	}
	list := run(t, "rpm", "-qp", "--qf", `[%{FILENAMES} %{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILEFLAGS:fflags}\n]`, p.rpm)
	files := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(list), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || !strings.HasPrefix(f[0], "/") {
			continue // rpm's own warnings
		}
		files[f[0]] = f[1:]
	}
	for path, want := range wantFiles {
		got, ok := files[path]
		if !ok {
			t.Errorf("rpm lacks %s", path)
			continue
		}
		if got[0] != want[0] || got[1] != want[1] {
			t.Errorf("rpm %s: %v, want %v", path, got[:2], want)
		}
	}
	if f := files["/etc/holdfast/holdfast.toml"]; len(f) < 3 || !strings.Contains(f[2], "c") || !strings.Contains(f[2], "n") {
		t.Errorf("rpm holdfast.toml flags %v, want %%config(noreplace) (c, n)", f)
	}
	for _, lic := range []string{"/usr/share/licenses/holdfast/copyright", "/usr/share/licenses/holdfast/third-party-licenses"} {
		if f, ok := files[lic]; !ok || len(f) < 3 || !strings.Contains(f[2], "l") {
			t.Errorf("rpm %s: %v, want a %%license file", lic, f)
		}
	}
	// %pre creates the user with systemd-sysusers or else useradd: without
	// either it fails and the install aborts.
	if req := run(t, "rpm", "-qp", "--requires", p.rpm); !strings.Contains(req, "(systemd or shadow-utils)\n") {
		t.Errorf("rpm requires, want (systemd or shadow-utils):\n%s", req)
	}
	if got := run(t, "rpm", "-qpl", p.rpm); !strings.Contains(got, "/usr/bin/holdfast\n") {
		t.Errorf("rpm -qpl lacks /usr/bin/holdfast:\n%s", got)
	}

	scripts := run(t, "rpm", "-qp", "--scripts", p.rpm)
	for _, want := range []string{"preinstall scriptlet", "postinstall scriptlet", "preuninstall scriptlet", "postuninstall scriptlet"} {
		if !strings.Contains(scripts, want) {
			t.Errorf("rpm --scripts lacks %s:\n%s", want, scripts)
		}
	}
	info := run(t, "rpm", "-qpi", p.rpm)
	for _, want := range []string{"Name        : holdfast", "Version     : " + testPkgVersion, "Release     : 1", "Architecture: " + rpmArch, "durable message appliance"} {
		if !strings.Contains(info, want) {
			t.Errorf("rpm -qpi lacks %q:\n%s", want, info)
		}
	}
	changelog := run(t, "rpm", "-qp", "--changelog", p.rpm)
	if !strings.Contains(changelog, "First packaged release") {
		t.Errorf("rpm has no changelog:\n%s", changelog)
	}
	// The newest entry names the package's version-release.
	if first, _, _ := strings.Cut(changelog, "\n"); !strings.HasSuffix(first, " - "+testPkgVersion+"-1") {
		t.Errorf("rpm changelog's newest entry %q, want it for %s-1", first, testPkgVersion)
	}
	if strings.Contains(changelog, "purge") {
		t.Errorf("rpm changelog mentions purge, which rpm has not:\n%s", changelog)
	}
}

// The same tree gives byte-identical packages, also on another machine: a
// second build runs under another host name (a UTS namespace) and is
// compared with the one the other tests use. Should the binaries differ,
// the tree was edited in between (go build with -trimpath is
// reproducible), so the pair is built again.
func TestPackagesReproducible(t *testing.T) {
	p := packages(t)
	unshare := needTool(t, "unshare", "util-linux")
	names := []string{filepath.Base(p.deb), filepath.Base(p.rpm)}
	binary := filepath.Join("build", p.arch, "holdfast")
	host, _ := os.Hostname()
	other := "reproducible-test-" + strconv.Itoa(os.Getpid())
	for attempt := 1; ; attempt++ {
		one, two := t.TempDir(), t.TempDir()
		if attempt == 1 {
			// release.sh below writes beside the packages: a copy.
			if out, err := exec.Command("cp", "-a", p.dir+"/.", one).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v\n%s", err, out)
			}
		} else if err := buildPackages(one); err != nil {
			t.Fatal(err)
		}
		args := []string{"--uts"}
		if os.Geteuid() != 0 {
			args = []string{"--user", "--map-root-user", "--uts"}
		}
		args = append(args, "/bin/sh", "-c", `hostname "$0" && [ "$(hostname)" = "$0" ] && exec "$@"`, other)
		args = append(args, buildArgs...)
		cmd := exec.Command(unshare, args...)
		cmd.Env = buildEnv(two)
		if out, err := cmd.CombinedOutput(); err != nil {
			if os.Geteuid() != 0 {
				t.Skipf("cannot build under another host name without root: %v\n%s", err, out)
			}
			t.Fatalf("build.sh under host name %s: %v\n%s", other, err, out)
		}
		if !sameFile(t, filepath.Join(one, binary), filepath.Join(two, binary)) {
			if attempt < 3 {
				t.Logf("the binary changed between two builds: the tree was edited meanwhile; again")
				continue
			}
			t.Fatalf("the binary differs between two builds of the same tree, %d times", attempt)
		}
		tarball := "holdfast-" + testPkgVersion + "-linux-" + p.arch + ".tar.gz"
		for _, dist := range []string{one, two} {
			runRelease(t, dist)
		}
		for _, name := range append(names, tarball, "SHA256SUMS") {
			if !sameFile(t, filepath.Join(one, name), filepath.Join(two, name)) {
				t.Errorf("%s differs between a build on %s and one on %s", name, host, other)
			}
		}
		return
	}
}

// runRelease runs packaging/release.sh on the packages in dist.
func runRelease(t *testing.T, dist string) string {
	t.Helper()
	cmd := exec.Command("./release.sh")
	cmd.Env = buildEnv(dist)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("release.sh: %v\n%s", err, out)
	}
	return string(out)
}

// TestRelease: make release's tarball holds what the packages install of
// the binary, config, manual page, completion and licences, byte for
// byte, and SHA256SUMS names the tarball and both packages and checks.
func TestRelease(t *testing.T) {
	p := packages(t)
	dist := t.TempDir()
	if out, err := exec.Command("cp", "-a", p.dir+"/.", dist).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	out := runRelease(t, dist)
	t.Logf("release.sh:\n%s", out)
	name := "holdfast-" + testPkgVersion + "-linux-" + p.arch
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || len(f[0]) != 64 {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's format", line)
		}
		listed = append(listed, f[1])
	}
	want := []string{name + ".tar.gz", filepath.Base(p.deb), filepath.Base(p.rpm)}
	if strings.Join(listed, " ") != strings.Join(want, " ") {
		t.Errorf("SHA256SUMS lists %q, want %q", listed, want)
	}
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = dist
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c SHA256SUMS: %v\n%s", err, out)
	}
	x := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", filepath.Join(dist, name+".tar.gz"), "-C", x).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	for _, f := range []string{"holdfast", "holdfast.toml", "holdfast.1.gz", "holdfast.bash", "third-party-licenses"} {
		if !sameFile(t, filepath.Join(x, name, f), filepath.Join(p.dir, "build", p.arch, f)) {
			t.Errorf("%s in the tarball differs from the packaged one", f)
		}
	}
	if !sameFile(t, filepath.Join(x, name, "LICENSE"), "../LICENSE") {
		t.Errorf("LICENSE in the tarball differs from the repository's")
	}
	if fi, err := os.Stat(filepath.Join(x, name, "holdfast")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the tarball's holdfast is not executable: %v %v", fi, err)
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	da, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(da) == sha256.Sum256(db)
}

// The binary is statically linked: the licence and notice texts of every
// module in it (go version -m) and of the Go standard library travel with
// it, in the deb's doc dir and the rpm's licence dir.
func TestThirdPartyLicenses(t *testing.T) {
	needTool(t, "dpkg-deb", "dpkg")
	p := packages(t)
	root := t.TempDir()
	run(t, "dpkg-deb", "-x", p.deb, root)
	bin := filepath.Join(root, "usr/bin/holdfast")
	text, err := os.ReadFile(filepath.Join(root, "usr/share/doc/holdfast/third-party-licenses"))
	if err != nil {
		t.Fatalf("deb: %v", err)
	}
	entries := licenceEntries(string(text))

	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	want := map[string]bool{}
	for _, l := range strings.Split(run(t, goBin, "version", "-m", bin), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 2 && strings.HasSuffix(f[0], ":"):
			want["std "+f[1]] = true // "path: go1.x.y"
		case len(f) >= 3 && f[0] == "dep":
			want[f[1]+" "+f[2]] = true
		case len(f) >= 3 && f[0] == "=>":
			t.Errorf("replaced module in the binary, %q: the notices name the replacement's version", l)
		}
	}
	if len(want) < 5 {
		t.Fatalf("go version -m %s lists only %v", bin, want)
	}
	for mod := range want {
		files, ok := entries[mod]
		if !ok {
			t.Errorf("third-party-licenses has no entry for %s", mod)
		} else if files == 0 {
			t.Errorf("third-party-licenses: %s has no licence text", mod)
		}
	}
	for mod := range entries {
		if !want[mod] {
			t.Errorf("third-party-licenses names %s, which is not in the binary", mod)
		}
	}
	if strings.Contains(string(text), "Licence: see below") {
		t.Logf("a licence was not recognised (summary only): %s", regexp.MustCompile(`Module: .*\nLicence: see below`).FindAllString(string(text), -1))
	}

	// The rpm ships the same file as a %license.
	if _, err := exec.LookPath("rpm2archive"); err == nil {
		out, err := exec.Command("sh", "-c", `rpm2archive -n <"$0" | tar -xOf - ./usr/share/licenses/holdfast/third-party-licenses`, p.rpm).Output()
		if err != nil {
			t.Fatalf("rpm: %v", err)
		}
		if !bytes.Equal(out, text) {
			t.Error("the rpm's third-party-licenses differs from the deb's")
		}
	}
}

// licenceEntries maps "module version" to the number of files quoted for it.
func licenceEntries(text string) map[string]int {
	entries := map[string]int{}
	cur := ""
	for _, l := range strings.Split(text, "\n") {
		if m, ok := strings.CutPrefix(l, "Module: "); ok {
			cur = m
			entries[cur] = 0
		} else if cur != "" && strings.HasPrefix(l, "--- "+cur+": ") {
			entries[cur]++
		}
	}
	return entries
}

// holdfast(1) is generated from the command definitions: every command
// `holdfast help` lists is in it, and lintian's no-manual-page is not
// overridden any more.
func TestManPage(t *testing.T) {
	needTool(t, "dpkg-deb", "dpkg")
	p := packages(t)
	root := t.TempDir()
	run(t, "dpkg-deb", "-x", p.deb, root)
	gz, err := os.ReadFile(filepath.Join(root, "usr/share/man/man1/holdfast.1.gz"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("gzip", "-dc")
	cmd.Stdin = bytes.NewReader(gz)
	page, err := cmd.Output()
	if err != nil {
		t.Fatalf("gzip -dc holdfast.1.gz: %v", err)
	}
	if !bytes.HasPrefix(page, []byte(".nh\n.TH holdfast 1")) && !bytes.Contains(page, []byte(".TH holdfast 1")) {
		t.Errorf("holdfast.1 has no .TH holdfast 1 header:\n%.300s", page)
	}
	help := run(t, filepath.Join(root, "usr/bin/holdfast"), "help")
	_, cmds, _ := strings.Cut(help, "COMMANDS:")
	cmds, _, _ = strings.Cut(cmds, "GLOBAL OPTIONS:")
	n := 0
	for _, l := range strings.Split(cmds, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] == "help," {
			continue
		}
		name := strings.TrimSuffix(f[0], ",")
		n++
		if !regexp.MustCompile(`(?m)^(\.SH |\.TP\n|\.PP\n|# |\\fB)?` + regexp.QuoteMeta(name) + `\b`).Match(page) {
			t.Errorf("holdfast.1 lacks the command %q", name)
		}
	}
	if n < 5 {
		t.Fatalf("found only %d commands in holdfast help:\n%s", n, help)
	}
	over, err := os.ReadFile("lintian-overrides")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(over, []byte("no-manual-page")) {
		t.Error("lintian-overrides still overrides no-manual-page")
	}
}

func TestRPMLint(t *testing.T) {
	needTool(t, "rpmlint", "rpmlint")
	p := packages(t)
	// rpmlint unpacks the payload with `rpm2cpio | cpio -id` in a
	// directory of its own, but nfpm names the members with absolute paths
	// and GNU cpio extracts those where they say: onto this machine's /etc
	// and /usr. A cpio first in PATH makes them relative.
	bin := t.TempDir()
	marker := filepath.Join(bin, "used")
	realCpio := needTool(t, "cpio", "cpio")
	wrapper := fmt.Sprintf("#!/bin/sh\ntouch %q\nexec %q --no-absolute-filenames \"$@\"\n", marker, realCpio)
	if err := os.WriteFile(filepath.Join(bin, "cpio"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	// Every deliberate exception is a filter in rpmlint.toml, with its
	// reason; anything else, even a warning, fails.
	cmd := exec.Command("rpmlint", "-c", "rpmlint.toml", p.rpm)
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil || !regexp.MustCompile(`\b0 errors, 0 warnings\b`).Match(out) {
		t.Fatalf("rpmlint: %v\n%s", err, out)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("rpmlint did not unpack the rpm with the cpio that keeps it in its own directory: %v", err)
	}
}

// Package versions: untagged builds sort by commit time, not by hash, and a
// tree with uncommitted changes is not packaged.
func TestPackageVersion(t *testing.T) {
	version := func(v, commit string, at int64) (string, error) {
		out, err := exec.Command("./version.sh", v, commit, strconv.FormatInt(at, 10)).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	day := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC).Unix()
	for _, c := range []struct {
		describe, commit string
		want             string
	}{
		{"v1.2.3", "abc1234", "1.2.3"},
		{"v1.2.3-rc1", "abc1234", "1.2.3~rc1"},
		{"v1.2.3-4-gabc1234", "abc1234", "1.2.3+4.gabc1234"},
		{"abc1234", "abc1234", "0.0.0~git20261130.090000.abc1234"},
	} {
		got, err := version(c.describe, c.commit, day)
		if err != nil || got != c.want {
			t.Errorf("version.sh %s = %q, %v; want %q", c.describe, got, err, c.want)
		}
	}
	for _, dirty := range []string{"abc1234-dirty", "v1.2.3-dirty", "v1.2.3-4-gabc1234-dirty"} {
		if got, err := version(dirty, "abc1234", day); err == nil || !strings.Contains(got, "uncommitted changes") {
			t.Errorf("version.sh %s = %q, %v; want it refused for uncommitted changes", dirty, got, err)
		}
	}

	// Two snapshots of one day whose hashes sort the other way round, and
	// the first release: each sorts after the one before, for dpkg and rpm.
	older, err := version("fffffff", "fffffff", day)
	if err != nil {
		t.Fatal(err)
	}
	newer, err := version("0000000", "0000000", day+3600)
	if err != nil {
		t.Fatal(err)
	}
	ordered := []string{older, newer, "0.1.0~rc1", "0.1.0", "0.1.0+3.g0000000"}
	for i := 1; i < len(ordered); i++ {
		a, b := ordered[i-1], ordered[i]
		if _, err := exec.LookPath("dpkg"); err == nil {
			if err := exec.Command("dpkg", "--compare-versions", a, "lt", b).Run(); err != nil {
				t.Errorf("dpkg: %s is not older than %s", a, b)
			}
		}
		if _, err := exec.LookPath("rpm"); err == nil {
			out := run(t, "rpm", "--eval", fmt.Sprintf(`%%{lua: print(rpm.vercmp("%s", "%s"))}`, a, b))
			if strings.TrimSpace(out) != "-1" {
				t.Errorf("rpm: vercmp(%s, %s) = %s, want -1", a, b, strings.TrimSpace(out))
			}
		}
	}
}

// The drop-in example changes nothing as shipped, and every setting in it
// is one systemd knows (all uncommented, on top of the unit).
func TestHandlerNeedsExample(t *testing.T) {
	const path = "../systemd/handler-needs.conf"
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var settings []string
	for _, l := range strings.Split(string(text), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || l == "[Service]":
		case strings.HasPrefix(l, "#") && regexp.MustCompile(`^#[A-Z][A-Za-z]+=`).MatchString(l):
			settings = append(settings, strings.TrimPrefix(l, "#"))
		case strings.HasPrefix(l, "#"):
		default:
			t.Errorf("%s: %q is not commented out: the example would change the service as shipped", path, l)
		}
	}
	if len(settings) < 8 {
		t.Fatalf("%s: only %d settings", path, len(settings))
	}
	sa := needTool(t, "systemd-analyze", "systemd")
	unit := verifiableUnit(t)
	u, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	// [Service] is the last section but [Install]: put the settings before it.
	withAll := strings.Replace(string(u), "\n[Install]", "\n"+strings.Join(settings, "\n")+"\n\n[Install]", 1)
	if err := os.WriteFile(unit, []byte(withAll), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(sa, append(verifyArgs, unit)...).CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify with every setting of %s: err=%v, output:\n%s", path, err, out)
	}
}
