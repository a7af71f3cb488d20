package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/idemq/idemq"
)

// Environment variables the commands read when their URL flag is not set.
const (
	envAMQPURL  = "IDEMQ_AMQP_URL"
	envRedisURL = "IDEMQ_REDIS_URL"

	defaultRedisURL = "redis://127.0.0.1:6379/0"
)

// amqpURL is the --url flag, else IDEMQ_AMQP_URL, else the loopback default.
func amqpURL(flag string) string {
	if flag != "" {
		return flag
	}
	return idemq.URLFromEnv()
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

// redactURL hides the password of a URL ("amqp://user:xxxxx@host/").
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return redact(raw)
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	q := u.Query()
	changed := false
	for k := range q {
		if isSecretParam(k) {
			q.Set(k, "xxxxx")
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

func isSecretParam(k string) bool {
	k = strings.ToLower(k)
	return k == "password" || k == "pass" || k == "pwd" || k == "secret" || k == "token"
}

var (
	// scheme://user:password@ — the password is everything up to the last
	// "@" before the host, so passwords containing ':' or '/' are covered.
	userinfoRE = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^:@/\s]*:)[^\s]*@`)
	paramRE    = regexp.MustCompile(`(?i)\b(password|pass|pwd|secret|token)=([^&\s"']+)`)
)

// redact hides every URL password and password=… parameter in free text.
func redact(s string) string {
	s = userinfoRE.ReplaceAllStringFunc(s, func(m string) string {
		i := strings.Index(m, "://")
		rest := m[i+3:]
		j := strings.Index(rest, ":")
		return m[:i+3] + rest[:j+1] + "xxxxx@"
	})
	return paramRE.ReplaceAllString(s, "${1}=xxxxx")
}

// redactWriter redacts every chunk written through it. The commands write
// whole lines, so a URL is never split between two writes.
type redactWriter struct{ w io.Writer }

func (r redactWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(r.w, redact(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// redactedError keeps the chain of err but prints it redacted.
type redactedError struct{ err error }

func (e redactedError) Error() string { return redact(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }

func redactErr(err error) error {
	if err == nil {
		return nil
	}
	var re redactedError
	if errors.As(err, &re) {
		return err
	}
	return redactedError{err}
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
	e := redactWriter{errw}
	return &cmdIO{
		out:  redactWriter{cmd.OutOrStdout()},
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
