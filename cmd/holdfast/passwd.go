package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/term"
)

// minPasswordLength is the shortest password `holdfast passwd` hashes.
const minPasswordLength = 12

func passwdCommand() *cli.Command {
	return &cli.Command{
		Name:  "passwd",
		Usage: "print the bcrypt hash of a password, for [auth.users.NAME] password or password_file",
		Description: "Reads the password from the terminal (twice, without echo) or, when stdin is not a\n" +
			"terminal, from the first line of stdin, and prints its bcrypt hash:\n\n" +
			"   holdfast passwd > /etc/holdfast/app.hash && chmod 600 /etc/holdfast/app.hash",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "cost", Value: 11, Usage: "bcrypt cost (10-16): each step doubles the time a guess takes"},
		},
		Action: func(c *cli.Context) error {
			cost := c.Int("cost")
			if cost < 10 || cost > 16 {
				return usageError(fmt.Errorf("--cost %d: must be 10-16", cost))
			}
			var pw []byte
			var err error
			if fd := int(os.Stdin.Fd()); term.IsTerminal(fd) {
				pw, err = readPasswordTwice(fd, c.App.ErrWriter)
			} else {
				pw, err = readPasswordLine(os.Stdin)
			}
			if err != nil {
				return usageError(err)
			}
			if err := checkPassword(pw); err != nil {
				return usageError(err)
			}
			hash, err := bcrypt.GenerateFromPassword(pw, cost)
			if err != nil {
				return runtimeError(err)
			}
			fmt.Fprintln(c.App.Writer, string(hash))
			return nil
		},
	}
}

func readPasswordTwice(fd int, prompt io.Writer) ([]byte, error) {
	fmt.Fprint(prompt, "Password: ")
	pw, err := term.ReadPassword(fd)
	fmt.Fprintln(prompt)
	if err != nil {
		return nil, fmt.Errorf("read password: %w", err)
	}
	fmt.Fprint(prompt, "Again: ")
	again, err := term.ReadPassword(fd)
	fmt.Fprintln(prompt)
	if err != nil {
		return nil, fmt.Errorf("read password: %w", err)
	}
	if !bytes.Equal(pw, again) {
		return nil, errors.New("the passwords differ")
	}
	return pw, nil
}

func readPasswordLine(r io.Reader) ([]byte, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read stdin: %w", err)
	}
	return []byte(strings.TrimRight(line, "\r\n")), nil
}

func checkPassword(pw []byte) error {
	switch {
	case len(pw) == 0:
		return errors.New("empty password")
	case len(pw) < minPasswordLength:
		return fmt.Errorf("password too short (%d characters, at least %d)", len(pw), minPasswordLength)
	case len(pw) > 72:
		return errors.New("password longer than 72 bytes, which bcrypt cannot hash")
	}
	return nil
}
