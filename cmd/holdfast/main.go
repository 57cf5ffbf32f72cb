// Command holdfast is a durable message appliance: an embedded NATS
// JetStream server on a validated store with in-process workers.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
)

func main() {
	err := newApp().RunContext(context.Background(), os.Args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error: "+err.Error())
	}
	os.Exit(exitCode(err))
}

// exitError carries a process exit code: 1 runtime failure, 2 usage or
// config error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageError(err error) error   { return &exitError{code: 2, err: err} }
func runtimeError(err error) error { return &exitError{code: 1, err: err} }

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}
