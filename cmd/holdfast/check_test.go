package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/holdfast-io/holdfast/internal/natstest"
	"github.com/holdfast-io/holdfast/internal/testcert"
)

// TestCheckAndRunRefuseValuesRunCannotSurvive: values that `check` used to
// accept and `run` could not live with (sync = "1ns" panicked inside
// nats-server, ack_wait = "1ns" spun, a stream on _INBOX.> stored its own
// PubAcks until the disk filled, port = -1 ran where status could not
// find it) are refused by both, each with its key path.
func TestCheckAndRunRefuseValuesRunCannotSurvive(t *testing.T) {
	t.Parallel()
	path := e2eWriteConfig(t, fmt.Sprintf(`[server]
port = -1

[jetstream]
store_dir = %q
sync = "1ns"

[http]
listen = ""

[streams.ORDERS]
subjects = ["orders.*"]

[streams.REPLIES]
subjects = ["_INBOX.>"]

[consumers.WORKER1]
stream = "ORDERS"
ack_wait = "1ns"
backoff = ["1ns"]
`, filepath.Join(t.TempDir(), "store")))
	want := []string{
		"server.port = -1: must be 1-65535",
		`jetstream.sync = "1ns": an interval must be at least 10ms`,
		`streams.REPLIES.subjects = "_INBOX.>": overlaps _INBOX.>`,
		"consumers.WORKER1.ack_wait = 1ns: must be at least 1s",
		"consumers.WORKER1.backoff[0] = 1ns: must be at least 10ms",
	}
	check := runHoldfast(t, nil, "check", "--config", path)
	if check.code != 1 {
		t.Errorf("check exited %d, want 1", check.code)
	}
	run := runHoldfast(t, nil, "run", "--config", path)
	if run.code != 2 {
		t.Errorf("run exited %d, want 2 (a config error)", run.code)
	}
	for _, w := range want {
		if !strings.Contains(check.stdout+check.stderr, w) {
			t.Errorf("check does not say %q:\n%s%s", w, check.stdout, check.stderr)
		}
		if !strings.Contains(run.stderr, w) {
			t.Errorf("run does not say %q:\n%s", w, run.stderr)
		}
	}
}

// TestCheckRefusesStoreShapesRunRefuses: a store dir holding a file named
// jetstream or a directory named holdfast.lock passed `check` and stopped
// `run`. Both refuse it now, naming the path, and leave it alone.
func TestCheckRefusesStoreShapesRunRefuses(t *testing.T) {
	for _, tt := range []struct {
		entry string
		dir   bool
		want  string
	}{
		{"jetstream", false, "jetstream is a regular file, not a directory"},
		{"holdfast.lock", true, "holdfast.lock is a directory, not a regular file"},
	} {
		t.Run(tt.entry, func(t *testing.T) {
			t.Parallel()
			store := filepath.Join(t.TempDir(), "store")
			if err := os.Mkdir(store, 0o750); err != nil {
				t.Fatal(err)
			}
			entry := filepath.Join(store, tt.entry)
			var err error
			if tt.dir {
				err = os.Mkdir(entry, 0o750)
			} else {
				err = os.WriteFile(entry, []byte("keep me"), 0o600)
			}
			if err != nil {
				t.Fatal(err)
			}
			path := e2eWriteConfig(t, e2eConfigTOML(store, natstest.FreePort(t), ""))
			check := runHoldfast(t, nil, "check", "--config", path)
			if check.code != 1 || !strings.Contains(check.stderr, "store dir "+store+": "+tt.want) || !strings.Contains(check.stderr, "move "+entry) {
				t.Errorf("check exited %d, want 1 and %q with the fix:\n%s%s", check.code, tt.want, check.stdout, check.stderr)
			}
			run := runHoldfast(t, nil, "run", "--config", path)
			if run.code == 0 || !strings.Contains(run.stderr, "store dir "+store+": "+tt.want) {
				t.Errorf("run exited %d, want a failure that says %q:\n%s", run.code, tt.want, run.stderr)
			}
			fi, err := os.Stat(entry)
			if err != nil || fi.IsDir() != tt.dir {
				t.Errorf("%s was changed: %v %v", entry, fi, err)
			}
		})
	}
}

// TestCheckRefusesDeepTableName: the 100 KB config with a 50,000-part
// table name took 9.7 s and 2.6 GB to be rejected; it is refused before it
// is decoded, by check and run alike.
func TestCheckRefusesDeepTableName(t *testing.T) {
	t.Parallel()
	path := e2eWriteConfig(t, "["+strings.Repeat("a.", 50_000)+"a]\n")
	want := path + ": line 1: a key or table name with more than 32 dot-separated parts"
	if res := runHoldfast(t, nil, "check", "--config", path); res.code != 1 || !strings.Contains(res.stderr, want) {
		t.Errorf("check exited %d, want 1 and %q:\n%.2000s", res.code, want, res.stderr)
	}
	if res := runHoldfast(t, nil, "run", "--config", path); res.code != 2 || !strings.Contains(res.stderr, want) {
		t.Errorf("run exited %d, want 2 and %q:\n%.2000s", res.code, want, res.stderr)
	}
}

// TestCheckLeavesNoTrace: `holdfast check` validates without side effects:
// a missing store dir is not created (nor its parents), an existing one
// gets no lock file — whether the config is valid or not.
func TestCheckLeavesNoTrace(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	for _, tc := range []struct {
		name, extra string
		code        int
	}{
		{"valid", "", 0},
		{"invalid", "[consumers.WORKER1]\nack_wait = \"1ns\"\n", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			missing := filepath.Join(base, tc.name, "not", "there")
			existing := filepath.Join(base, tc.name+"-existing")
			if err := os.Mkdir(existing, 0o750); err != nil {
				t.Fatal(err)
			}
			for _, store := range []string{missing, existing} {
				path := e2eWriteConfig(t, fmt.Sprintf("[jetstream]\nstore_dir = %q\n\n[http]\nlisten = \"\"\n\n%s", store, tc.extra))
				res := runHoldfast(t, nil, "check", "--config", path)
				if res.code != tc.code {
					t.Errorf("check on %s exited %d, want %d: %s%s", store, res.code, tc.code, res.stdout, res.stderr)
				}
				if store == missing && tc.code == 0 && !strings.Contains(res.stdout, "does not exist yet; run creates it") {
					t.Errorf("check does not say the store dir will be created:\n%s", res.stdout)
				}
			}
			if _, err := os.Stat(filepath.Join(base, tc.name)); !os.IsNotExist(err) {
				t.Errorf("check created the missing store dir's parent (stat: %v)", err)
			}
			if entries, _ := os.ReadDir(existing); len(entries) != 0 {
				t.Errorf("check left %d file(s) in the store dir, first %s", len(entries), entries[0].Name())
			}
		})
	}
}

// TestCheckRefusesHandlerCommandRunRefuses: an exec command that is
// missing, a directory or not executable passed `check` and stopped `run`.
// Both refuse it now, naming the consumer and the path.
func TestCheckRefusesHandlerCommandRunRefuses(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, command, want string
	}{
		{"missing", filepath.Join(dir, "missing"), "no such file or directory"},
		{"directory", dir, "is a directory"},
		{"not executable", notExec, "is not executable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			extra := fmt.Sprintf("\n[consumers.WORKER2]\nstream = \"ORDERS\"\nhandler = \"exec\"\n[consumers.WORKER2.exec]\ncommand = [%q]\n", tt.command)
			path := e2eWriteConfig(t, e2eConfigTOML(filepath.Join(t.TempDir(), "store"), natstest.FreePort(t), extra))
			want := "consumers.WORKER2.exec: exec handler: command " + tt.command
			check := runHoldfast(t, nil, "check", "--config", path)
			if check.code != 1 || !strings.Contains(check.stderr, want) || !strings.Contains(check.stderr, tt.want) {
				t.Errorf("check exited %d, want 1 and %q ... %q:\n%s%s", check.code, want, tt.want, check.stdout, check.stderr)
			}
			run := runHoldfast(t, nil, "run", "--config", path)
			if run.code == 0 || !strings.Contains(run.stderr, want) {
				t.Errorf("run exited %d, want a failure that says %q:\n%s", run.code, want, run.stderr)
			}
		})
	}
}

// TestCheckAndRunRefuseFileWithoutKeys: a config file that exists and sets
// no key (empty, or only comments) is refused by check (exit 1) and run
// (exit 2) alike, naming the file and what to do, as a reload refuses it.
// check used to pass it and run started on the built-in defaults, whose
// WORKER1 log handler acknowledges the waiting messages unprocessed.
func TestCheckAndRunRefuseFileWithoutKeys(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"", "# [consumers.WORKER1]\n# handler = \"exec\"\n"} {
		path := e2eWriteConfig(t, text)
		check := runHoldfast(t, nil, "check", "--config", path)
		if check.code != 1 {
			t.Errorf("check of %q exited %d, want 1:\n%s%s", text, check.code, check.stdout, check.stderr)
		}
		run := runHoldfast(t, nil, "run", "--config", path)
		if run.code != 2 {
			t.Errorf("run on %q exited %d, want 2 (a config error):\n%s", text, run.code, run.stderr)
		}
		for name, out := range map[string]string{"check": check.stdout + check.stderr, "run": run.stderr} {
			for _, w := range []string{path, "sets no key", "holdfast config"} {
				if !strings.Contains(out, w) {
					t.Errorf("%s on %q does not say %q:\n%s", name, text, w, out)
				}
			}
		}
	}
}

// TestCheckAndRunRefuseTLSFilesThatDoNotLoad: a certificate with another's
// key, and a CA file without a certificate, are refused by check and run
// alike, naming the key. check passed them, and run then stopped with
// "tls: error parsing X509 certificate/key pair", naming no key.
func TestCheckAndRunRefuseTLSFilesThatDoNotLoad(t *testing.T) {
	t.Parallel()
	certs, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(t.TempDir(), "store")
	config := func(cert, key, ca string) string {
		return e2eWriteConfig(t, e2eConfigTOML(store, natstest.FreePort(t), fmt.Sprintf(`
[tls]
cert_file = %q
key_file = %q
ca_file = %q
`, cert, key, ca)))
	}
	for _, tt := range []struct {
		cert, key, ca string
		want          string
	}{
		{certs.ServerCert, certs.ClientKey, certs.CA, fmt.Sprintf("tls.cert_file = %q: does not load with tls.key_file %q", certs.ServerCert, certs.ClientKey)},
		{certs.ServerCert, certs.ServerKey, certs.ClientKey, fmt.Sprintf("tls.ca_file = %q: holds no PEM certificate", certs.ClientKey)},
	} {
		path := config(tt.cert, tt.key, tt.ca)
		check := runHoldfast(t, nil, "check", "--config", path)
		if check.code != 1 || !strings.Contains(check.stdout+check.stderr, tt.want) {
			t.Errorf("check: exit %d, want 1 saying %q:\n%s%s", check.code, tt.want, check.stdout, check.stderr)
		}
		run := runHoldfast(t, nil, "run", "--config", path)
		if run.code == 0 || !strings.Contains(run.stderr, tt.want) {
			t.Errorf("run: exit %d, want a refusal saying %q:\n%s", run.code, tt.want, run.stderr)
		}
	}
	if ok := runHoldfast(t, nil, "check", "--config", config(certs.ServerCert, certs.ServerKey, certs.CA)); ok.code != 0 {
		t.Errorf("check of a matching pair: exit %d\n%s%s", ok.code, ok.stdout, ok.stderr)
	}
}

// TestCheckCountsEveryProblem: check's count and list hold every problem,
// those of validation and the ones check finds itself (a missing script).
// It printed "2 problem(s)" and then the third after the list.
func TestCheckCountsEveryProblem(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing")
	extra := fmt.Sprintf("\n[log]\nlevel = \"loud\"\n\n[consumers.WORKER2]\nstream = \"ORDERS\"\nhandler = \"exec\"\nmax_deliver = 0\n[consumers.WORKER2.exec]\ncommand = [%q]\n", missing)
	path := e2eWriteConfig(t, e2eConfigTOML(filepath.Join(t.TempDir(), "store"), natstest.FreePort(t), extra))
	res := runHoldfast(t, nil, "check", "--config", path)
	if res.code != 1 || !strings.Contains(res.stderr, "3 problem(s):") {
		t.Fatalf("check exited %d, want 1 and \"3 problem(s):\":\n%s", res.code, res.stderr)
	}
	list := res.stderr[strings.Index(res.stderr, "3 problem(s):"):]
	for _, want := range []string{"log.level", "consumers.WORKER2.max_deliver", "consumers.WORKER2.exec: exec handler: command " + missing} {
		if !strings.Contains(list, "\n  "+want) {
			t.Errorf("the list does not hold %q as an item:\n%s", want, res.stderr)
		}
	}
}

// TestCheckRefusesAKeyRunRefuses: on an encrypted store, a key that does
// not open it, and no key at all, are refused by check as run refuses
// them; check said "ok" to both, and run then stopped.
func TestCheckRefusesAKeyRunRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	port := natstest.FreePort(t)
	keys := map[string]string{"right": "kW3x9d7Jq2Zp8vN4mT6yR1sB5hL0cF3gA9eU7iO2wQ=\n", "wrong": "a-different-key-of-enough-length-0123456789\n"}
	for name, key := range keys {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(key), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	right := e2eWriteConfig(t, rotationConfig(store, port, filepath.Join(dir, "right"), ""))
	p := startHoldfast(t, right)
	p.waitReady()
	if res := runHoldfast(t, nil, "pub", "--config", right, "orders.created", "x"); res.code != 0 {
		t.Fatalf("pub: exit %d\n%s", res.code, res.stderr)
	}
	p.stop()
	if res := runHoldfast(t, nil, "check", "--config", right); res.code != 0 {
		t.Fatalf("check with the store's key: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	for _, tt := range []struct{ name, key, want string }{
		{"wrong key", filepath.Join(dir, "wrong"), "do not open with the key in"},
		{"no key", "", "but jetstream.encryption_key_file is not set"},
	} {
		cfg := e2eWriteConfig(t, rotationConfig(store, port, tt.key, ""))
		check := runHoldfast(t, nil, "check", "--config", cfg)
		if check.code != 1 || !strings.Contains(check.stderr, "encryption key does not open the store") || !strings.Contains(check.stderr, tt.want) {
			t.Errorf("check with %s: exit %d, want 1 saying %q\n%s%s", tt.name, check.code, tt.want, check.stdout, check.stderr)
		}
		run := runHoldfast(t, nil, "run", "--config", cfg)
		if run.code != 1 || !strings.Contains(run.stderr, "encryption key does not open the store") {
			t.Errorf("run with %s: exit %d, want 1 refusing the key\n%s", tt.name, run.code, run.stderr)
		}
	}
}
