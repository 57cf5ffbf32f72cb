package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
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
// NATS client would.
func connect(c *cli.Context) (*config.Config, *nats.Conn, jetstream.JetStream, error) {
	cfg, _, err := loadConfig(c)
	if err != nil {
		return nil, nil, nil, err
	}
	url := c.String("server")
	if url == "" {
		url = clientURL(cfg)
	}
	nc, err := nats.Connect(url, nats.Name("holdfast-cli"), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, nil, nil, runtimeError(fmt.Errorf("cannot connect to holdfast at %s: %w (is it running? see systemctl status holdfast)", url, err))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, runtimeError(err)
	}
	return cfg, nc, js, nil
}

// isTerminal reports whether f is a character device (progress output).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
