package packaging

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	backupServicePath = "../systemd/holdfast-backup.service"
	backupTimerPath   = "../systemd/holdfast-backup.timer"
)

// The nightly backup: a oneshot service as the holdfast user in the
// sandbox of holdfast.service, started by a timer that the package never
// enables.
func TestBackupUnitsContract(t *testing.T) {
	svc := unitFile(t, backupServicePath)["Service"]
	main := unitFile(t, unitPath)["Service"]
	want := map[string]string{
		"Type":           "oneshot",
		"User":           "holdfast",
		"Group":          "holdfast",
		"StateDirectory": "holdfast-backup",
	}
	for k, v := range want {
		if got := svc[k]; len(got) != 1 || got[0] != v {
			t.Errorf("holdfast-backup.service [Service] %s = %q, want %q", k, got, v)
		}
	}
	if got := svc["ExecStart"]; len(got) != 1 || !strings.Contains(got[0], "/usr/bin/holdfast backup ") {
		t.Errorf("holdfast-backup.service ExecStart = %q, want holdfast backup", got)
	}
	// Every sandbox setting of holdfast.service applies to the backup too,
	// with the same value.
	sandbox := []string{"CapabilityBoundingSet", "AmbientCapabilities", "DevicePolicy", "KeyringMode", "LockPersonality",
		"MemoryDenyWriteExecute", "NoNewPrivileges", "PrivateMounts", "PrivateDevices", "PrivateIPC", "PrivateTmp",
		"PrivateUsers", "ProcSubset", "ProtectClock", "ProtectControlGroups", "ProtectHome", "ProtectHostname",
		"ProtectKernelLogs", "ProtectKernelModules", "ProtectKernelTunables", "ProtectProc", "ProtectSystem",
		"RemoveIPC", "RestrictAddressFamilies", "RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID",
		"SystemCallArchitectures", "SystemCallFilter", "SystemCallErrorNumber", "UMask", "InaccessiblePaths",
		"Environment"}
	for _, k := range sandbox {
		if len(main[k]) == 0 {
			t.Errorf("holdfast.service has no %s: update this list", k)
			continue
		}
		if k == "Environment" {
			if !strings.Contains(strings.Join(svc[k], "\n"), main[k][0]) {
				t.Errorf("holdfast-backup.service lacks Environment=%s", main[k][0])
			}
			continue
		}
		if strings.Join(svc[k], "\n") != strings.Join(main[k], "\n") {
			t.Errorf("holdfast-backup.service %s = %q, holdfast.service has %q", k, svc[k], main[k])
		}
	}
	if _, ok := unitFile(t, backupServicePath)["Install"]; ok {
		t.Error("holdfast-backup.service has an [Install] section: only its timer is enabled")
	}
	timer := unitFile(t, backupTimerPath)
	if got := timer["Install"]["WantedBy"]; len(got) != 1 || got[0] != "timers.target" {
		t.Errorf("holdfast-backup.timer WantedBy = %q, want timers.target", got)
	}
	if got := timer["Timer"]["Persistent"]; len(got) != 1 || got[0] != "true" {
		t.Errorf("holdfast-backup.timer Persistent = %q, want true (a night missed while off is made up)", got)
	}
	if got := timer["Timer"]["OnCalendar"]; len(got) != 1 {
		t.Errorf("holdfast-backup.timer OnCalendar = %q, want one", got)
	}
	// Disabled by default: no maintainer script enables or starts it.
	for _, name := range []string{"preinstall.sh", "postinstall.sh", "postremove.sh"} {
		text, err := os.ReadFile(filepath.Join("scripts", name))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(text, []byte("holdfast-backup")) {
			t.Errorf("scripts/%s mentions holdfast-backup: the timer must stay disabled unless an admin enables it", name)
		}
	}
}

// verifiableBackupUnits writes both units, with /usr/bin/holdfast replaced
// by bin, into a fresh directory and returns it.
func verifiableBackupUnits(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range []string{backupServicePath, backupTimerPath} {
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		text = bytes.ReplaceAll(text, []byte("/usr/bin/holdfast"), []byte(bin))
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(p)), text, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestBackupUnitsVerify(t *testing.T) {
	sa := needTool(t, "systemd-analyze", "systemd")
	bin, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	dir := verifiableBackupUnits(t, bin)
	cmd := exec.Command(sa, append(verifyArgs, "holdfast-backup.timer", "holdfast-backup.service")...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: err=%v, output:\n%s", err, out)
	}
	out := run(t, sa, "security", "--offline=true", "--no-pager",
		fmt.Sprintf("--threshold=%d", int(maxExposure*10)), filepath.Join(dir, "holdfast-backup.service"))
	m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	score, _ := strconv.ParseFloat(m[1], 64)
	t.Logf("systemd-analyze security exposure of holdfast-backup.service: %.1f", score)
	if score > maxExposure {
		t.Fatalf("exposure %.1f > %.1f:\n%s", score, maxExposure, out)
	}
}

// systemdExpand does what systemd does to an Exec line before running it:
// %% is %, $$ is $, ${NAME} is the unit's Environment= value.
func systemdExpand(line string, env map[string]string) string {
	line = regexp.MustCompile(`\$\{([A-Z_]+)\}`).ReplaceAllStringFunc(line, func(m string) string {
		if strings.Contains(line, "$"+m) { // $${NAME}: left for the shell
			return m
		}
		return env[m[2:len(m)-1]]
	})
	return strings.NewReplacer("%%", "%", "$$", "$").Replace(line)
}

// splitExec splits an Exec line into words, honouring single quotes as
// systemd does for the simple lines of this unit.
func splitExec(line string) []string {
	var words []string
	var cur strings.Builder
	quoted, inWord := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// The ExecStart and ExecStartPost lines do what the unit's comments say:
// holdfast backup into a new directory named after the time, then the
// backups older than HOLDFAST_BACKUP_KEEP_DAYS deleted, nothing else.
func TestBackupUnitCommands(t *testing.T) {
	svc := unitFile(t, backupServicePath)["Service"]
	env := map[string]string{}
	for _, e := range svc["Environment"] {
		k, v, _ := strings.Cut(e, "=")
		env[k] = v
	}
	if env["HOLDFAST_BACKUP_DIR"] != "/var/lib/holdfast-backup" || env["HOLDFAST_BACKUP_KEEP_DAYS"] == "" {
		t.Fatalf("Environment = %q", svc["Environment"])
	}
	root := t.TempDir()
	env["HOLDFAST_BACKUP_DIR"] = filepath.Join(root, "backups")
	if err := os.Mkdir(env["HOLDFAST_BACKUP_DIR"], 0o750); err != nil {
		t.Fatal(err)
	}
	// A stand-in for holdfast that records its arguments.
	args := filepath.Join(root, "args")
	fake := filepath.Join(root, "holdfast")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"$@\" >"+args+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var cmdEnv []string
	for k, v := range env {
		cmdEnv = append(cmdEnv, k+"="+v)
	}
	runLine := func(line string) {
		t.Helper()
		words := splitExec(systemdExpand(strings.ReplaceAll(line, "/usr/bin/holdfast", fake), env))
		cmd := exec.Command(words[0], words[1:]...)
		cmd.Env = append(cmdEnv, "PATH=/usr/bin:/bin")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%q: %v\n%s", words, err, out)
		}
	}

	runLine(svc["ExecStart"][0])
	got, err := os.ReadFile(args)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(got))
	if len(f) != 2 || f[0] != "backup" || !regexp.MustCompile(`^`+regexp.QuoteMeta(env["HOLDFAST_BACKUP_DIR"])+`/20\d{6}T\d{6}Z$`).MatchString(f[1]) {
		t.Fatalf("ExecStart ran holdfast %q, want backup %s/<YYYYMMDDThhmmssZ>", got, env["HOLDFAST_BACKUP_DIR"])
	}

	// Three backups: 30 days, 2 days and 1 hour old, and a directory that
	// is not a backup of the timer: only the first goes.
	keep, _ := strconv.Atoi(env["HOLDFAST_BACKUP_KEEP_DAYS"])
	now := time.Now()
	dirs := map[string]time.Time{
		"20260101T023000Z": now.Add(-time.Duration(keep+23) * 24 * time.Hour),
		"20260129T023000Z": now.Add(-48 * time.Hour),
		"20260131T023000Z": now.Add(-time.Hour),
		"before-upgrade":   now.Add(-time.Duration(keep+23) * 24 * time.Hour),
	}
	for name, mtime := range dirs {
		p := filepath.Join(env["HOLDFAST_BACKUP_DIR"], name)
		if err := os.MkdirAll(filepath.Join(p, "streams"), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	for _, line := range svc["ExecStartPost"] {
		runLine(line)
	}
	for name := range dirs {
		_, err := os.Stat(filepath.Join(env["HOLDFAST_BACKUP_DIR"], name))
		if gone := os.IsNotExist(err); gone != (name == "20260101T023000Z") {
			t.Errorf("after ExecStartPost: %s gone = %v", name, gone)
		}
	}
}
