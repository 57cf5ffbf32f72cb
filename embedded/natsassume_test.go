package embedded

// Assumptions holdfast makes about the nats-server version in go.mod, one
// test each, so that an upgrade that breaks one fails by name.

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// TestAssumeSystemAccountAddsNoAuthUser: options built in code with a
// system account and only $G get a password-less no-auth user from the
// server, unless an authorization block was parsed. defineAuthorization
// exists for this rule; if the server drops the rule, this test says so
// and the workaround can go.
func TestAssumeSystemAccountAddsNoAuthUser(t *testing.T) {
	t.Parallel()
	build := func(define bool) *server.Options {
		opts := &server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true}
		if define {
			if err := defineAuthorization(opts); err != nil {
				t.Fatal(err)
			}
		}
		opts.Users = []*server.User{{Username: "app", Password: "x"}, {Username: "ops", Password: "y", Account: systemAccount(opts)}}
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		ns.Shutdown()
		return opts
	}
	if opts := build(false); opts.NoAuthUser == "" || len(opts.Users) != 3 {
		t.Errorf("without an authorization block: no-auth user %q, %d users; the server no longer adds its own no-auth user", opts.NoAuthUser, len(opts.Users))
	}
	if opts := build(true); opts.NoAuthUser != "" || len(opts.Users) != 2 {
		t.Errorf("with defineAuthorization: no-auth user %q, %d users, want none added", opts.NoAuthUser, len(opts.Users))
	}
}
