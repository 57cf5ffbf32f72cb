package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/holdfast-io/holdfast/config"
)

var serverFlag = &cli.StringFlag{
	Name:    "server",
	Aliases: []string{"s"},
	Usage:   "NATS URL of the running holdfast (default: from the config's [server] host and port)",
	EnvVars: []string{"HOLDFAST_SERVER"},
}

// clientURL is the address of the running instance described by cfg.
func clientURL(cfg *config.Config) string {
	host := cfg.Server.Host
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "nats://" + net.JoinHostPort(host, strconv.Itoa(cfg.Server.Port))
}

// connect opens a client connection to the running holdfast, like any
// NATS client would; jsOpts go to its JetStream context.
func connect(c *cli.Context, jsOpts ...jetstream.JetStreamOpt) (*config.Config, *nats.Conn, jetstream.JetStream, error) {
	cfg, _, err := loadConfig(c)
	if err != nil {
		return nil, nil, nil, err
	}
	url := c.String("server")
	if url == "" {
		url = clientURL(cfg)
	}
	opts, err := clientOptions(c, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	opts = append(opts, nats.Name("holdfast-cli"), nats.Timeout(5*time.Second))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, nil, runtimeError(fmt.Errorf("cannot connect to holdfast at %s: %w (%s)", url, err, connectHint(c, err)))
	}
	js, err := jetstream.New(nc, jsOpts...)
	if err != nil {
		nc.Close()
		return nil, nil, nil, runtimeError(err)
	}
	return cfg, nc, js, nil
}

// connectJetStream is connect for the commands that need JetStream's API
// (dlq, backup, restore): a server that answers that it has no JetStream,
// or where nothing answers JetStream requests, is refused at once, saying
// so, rather than at the first request with nats.go's "no responders
// available for request". Any other answer (a user not allowed
// $JS.API.INFO, a timeout) is left to the command's own requests. pub does
// without: a publisher may be allowed its subjects only, and a publish
// denied by permissions goes unanswered until the timeout.
func connectJetStream(c *cli.Context) (*config.Config, *nats.Conn, jetstream.JetStream, error) {
	cfg, nc, js, err := connect(c)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, 5*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	var hint string
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		hint = "this server has no JetStream for this client: it is not holdfast, or the user has no JetStream; check --server (or the config's [server] host and port) and the credentials"
	case errors.Is(err, nats.ErrNoResponders):
		hint = "nothing answers JetStream requests there: holdfast may still be starting (see holdfast status), or this is not holdfast; check --server (or the config's [server] host and port)"
	}
	if hint != "" {
		url := nc.ConnectedUrlRedacted()
		nc.Close()
		return nil, nil, nil, runtimeError(fmt.Errorf("JetStream at %s: %w (%s)", url, err, hint))
	}
	return cfg, nc, js, nil
}

// isTerminal reports whether f is a character device (progress output).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// clientFlags are the credential and TLS flags of every command that
// connects to the running holdfast (those with --server).
func clientFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "user", Usage: "user name from [auth.users.NAME]", EnvVars: []string{"HOLDFAST_USER"}},
		&cli.StringFlag{Name: "password", Usage: "the user's password (prefer HOLDFAST_PASSWORD: a flag shows in ps)", EnvVars: []string{"HOLDFAST_PASSWORD"}},
		&cli.StringFlag{Name: "token", Usage: "the [auth] token (default: read from auth.token_file when readable)", EnvVars: []string{"HOLDFAST_TOKEN"}},
		&cli.StringFlag{Name: "creds", Usage: "file with an nkey seed (SU...) or a NATS .creds file", EnvVars: []string{"HOLDFAST_CREDS"}},
		&cli.StringFlag{Name: "tls-ca", Usage: "CA file to check the server's certificate (default: [tls] ca_file)", EnvVars: []string{"HOLDFAST_TLS_CA"}},
		&cli.StringFlag{Name: "tls-cert", Usage: "client certificate, for [tls] verify = true", EnvVars: []string{"HOLDFAST_TLS_CERT"}},
		&cli.StringFlag{Name: "tls-key", Usage: "client certificate's private key", EnvVars: []string{"HOLDFAST_TLS_KEY"}},
	}
}

// clientOptions builds the connection options from the flags and, where
// they are silent, from the config: TLS with its CA, and the token from
// auth.token_file when this user may read it.
func clientOptions(c *cli.Context, cfg *config.Config) ([]nats.Option, error) {
	var opts []nats.Option
	ca := c.String("tls-ca")
	if ca == "" {
		ca = cfg.TLS.CAFile
	}
	cert, key := c.String("tls-cert"), c.String("tls-key")
	if (cert == "") != (key == "") {
		return nil, usageError(errors.New("--tls-cert and --tls-key go together"))
	}
	if cfg.TLS.Enabled() || ca != "" || cert != "" {
		opts = append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12}))
		if ca != "" {
			opts = append(opts, nats.RootCAs(ca))
		}
		if cert != "" {
			opts = append(opts, nats.ClientCert(cert, key))
		}
	}
	user, password, token, creds := c.String("user"), c.String("password"), c.String("token"), c.String("creds")
	n := 0
	for _, set := range []bool{user != "", token != "", creds != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return nil, usageError(errors.New("use one of --user/--password, --token or --creds"))
	}
	switch {
	case user != "":
		opts = append(opts, nats.UserInfo(user, password))
	case token != "":
		opts = append(opts, nats.Token(token))
	case creds != "":
		b, err := os.ReadFile(creds)
		if err != nil {
			return nil, usageError(fmt.Errorf("--creds: %w", err))
		}
		if strings.Contains(string(b), "BEGIN NATS USER JWT") {
			opts = append(opts, nats.UserCredentials(creds))
		} else {
			o, err := nats.NkeyOptionFromSeed(creds)
			if err != nil {
				return nil, usageError(fmt.Errorf("--creds %s: neither a .creds file nor an nkey seed: %w", creds, err))
			}
			opts = append(opts, o)
		}
	case cfg.Auth.Token != "" && !config.IsBcrypt(cfg.Auth.Token):
		opts = append(opts, nats.Token(cfg.Auth.Token))
	case cfg.Auth.TokenFile != "":
		if b, err := os.ReadFile(cfg.Auth.TokenFile); err == nil {
			if t := strings.TrimSpace(string(b)); !config.IsBcrypt(t) {
				opts = append(opts, nats.Token(t))
			}
		}
	}
	return opts, nil
}

// connectHint says what to try after a failed connection.
func connectHint(c *cli.Context, err error) string {
	msg := strings.ToLower(err.Error())
	given := c.String("user") != "" || c.String("token") != "" || c.String("creds") != ""
	switch {
	case strings.Contains(msg, "authorization") && given:
		// Credentials were given: the hint is about them, not their absence.
		return "the server refused the credentials given (--user and --password/HOLDFAST_PASSWORD, --token or --creds): check them against [auth] in holdfast's config"
	case strings.Contains(msg, "authorization"):
		return "the server requires credentials: pass --user with HOLDFAST_PASSWORD, --token or --creds"
	case strings.Contains(msg, "certificate") || strings.Contains(msg, "x509"):
		return "TLS: pass the server's CA with --tls-ca (or set [tls] ca_file), and for verify = true a client certificate with --tls-cert/--tls-key"
	case strings.Contains(msg, "tls"):
		return "TLS problem: see [tls] in the config and --tls-ca/--tls-cert/--tls-key"
	}
	if underSystemd() {
		return "is it running? see systemctl status holdfast"
	}
	return "is it running? start it with holdfast run"
}

// underSystemd tells whether systemd manages this machine (sd_booted(3)):
// only then is `systemctl` the place to look.
func underSystemd() bool {
	fi, err := os.Stat("/run/systemd/system")
	return err == nil && fi.IsDir()
}
