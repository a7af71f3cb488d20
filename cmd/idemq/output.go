package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/redact"
)

// Environment variables the commands read when their URL flag is not set.
const (
	envAMQPURL  = "IDEMQ_AMQP_URL"
	envRedisURL = "IDEMQ_REDIS_URL"

	defaultRedisURL = "redis://127.0.0.1:6379/0"
)

// amqpURL is the --url flag, else IDEMQ_AMQP_URL, else the loopback default.
// An amqps:// URL trusts the CA in IDEMQ_AMQP_CA (tls.go).
func amqpURL(flag string) string {
	if flag != "" {
		return withAMQPCA(flag, os.Getenv)
	}
	return withAMQPCA(idemq.URLFromEnv(), os.Getenv)
}

// redisURL is the --redis-url flag, else IDEMQ_REDIS_URL, else the default.
func redisURL(flag string) string {
	if flag != "" {
		return flag
	}
	if u := os.Getenv(envRedisURL); u != "" {
		return u
	}
	return defaultRedisURL
}

// redactURL hides the password and secret parameters of a URL.
func redactURL(raw string) string { return redact.URL(raw) }

// redactWriter redacts every chunk written through it (redact.Text, then
// the literal secrets). The commands write whole lines, so a URL is never
// split between two writes.
type redactWriter struct {
	w       io.Writer
	secrets []string
}

func (r redactWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(r.w, redact.Scrub(redact.Text(string(p)), r.secrets)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// redactedError keeps the chain of err but prints it redacted.
type redactedError struct {
	err     error
	secrets []string
}

func (e redactedError) Error() string {
	return redact.Scrub(redact.Text(e.err.Error()), e.secrets)
}
func (e redactedError) Unwrap() error { return e.err }

// redactErr wraps err so that it prints redacted, scrubbed of secrets too.
func redactErr(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	var re redactedError
	if errors.As(err, &re) && len(secrets) == 0 {
		return err
	}
	return redactedError{err: err, secrets: secrets}
}

// io of one command: redacted stdout and stderr, a logger on stderr.
type cmdIO struct {
	out  io.Writer
	err  io.Writer
	in   io.Reader
	log  *slog.Logger
	json bool
	// tty: stderr is a terminal (progress bars).
	tty bool
}

func newIO(cmd *cobra.Command, output string) (*cmdIO, error) {
	switch output {
	case "", "text", "json":
	default:
		return nil, fmt.Errorf("--output %q: want text or json", output)
	}
	errw := cmd.ErrOrStderr()
	tty := false
	if f, ok := errw.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	e := redactWriter{w: errw}
	return &cmdIO{
		out:  redactWriter{w: cmd.OutOrStdout()},
		err:  e,
		in:   cmd.InOrStdin(),
		log:  slog.New(slog.NewTextHandler(e, &slog.HandlerOptions{Level: slog.LevelWarn})),
		json: output == "json",
		tty:  tty,
	}, nil
}

func (c *cmdIO) printJSON(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func (c *cmdIO) printf(format string, args ...any) { fmt.Fprintf(c.out, format, args...) }

// addOutputFlag adds --output/-o to a read command.
func addOutputFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", "text", "output format: text or json")
}

// wrapRunE redacts the error a command returns (main prints it).
func wrapRunE(f func(cmd *cobra.Command, args []string) error) func(cmd *cobra.Command, args []string) error {
	return func(cmd *cobra.Command, args []string) error { return redactErr(f(cmd, args)) }
}
