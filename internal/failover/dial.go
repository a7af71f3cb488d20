package failover

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/redact"
)

// ErrInvalidURL is matched (errors.Is) by the error of a broker URL that
// does not parse (idemq.ErrInvalidURL is this error). The URL is named
// redacted, never with its password.
var ErrInvalidURL = errors.New("idemq: invalid AMQP URL")

// dialRedacted connects to rawURL with dial (a Config.Dial) and keeps the
// URL's password out of the error it returns, which the consumer and the
// publisher log on every reconnect. amqp091-go's parse error quotes the
// whole URL, password included (and a password holding '/' or '#' is
// misread as host, port or path, so it leaks even piecewise): a URL that
// does not parse gets a fresh error that names it redacted and carries no
// parser text. A dial error is wrapped with the redacted URL and its own
// text scrubbed of the URL's secrets.
func dialRedacted(dial func(string, amqp.Config) (*amqp.Connection, error), rawURL string, cfg amqp.Config) (*amqp.Connection, error) {
	if _, err := amqp.ParseURI(rawURL); err != nil {
		return nil, fmt.Errorf("%w %s: want amqp[s]://user:password@host:port/vhost[?params], "+
			"with '?', '#', '@', ':' and '/' in the user name and password percent-encoded", ErrInvalidURL, redact.URL(rawURL))
	}
	conn, err := dial(rawURL, cfg)
	if err != nil {
		return nil, &dialError{url: redact.URL(rawURL), secrets: redact.Secrets(rawURL), err: err}
	}
	return conn, nil
}

// dialError is a failed dial: the redacted URL and the cause, printed
// without the URL's secrets (a custom Dial may quote its URL).
type dialError struct {
	url     string
	secrets []string
	err     error
}

func (e *dialError) Error() string {
	return e.url + ": " + redact.Scrub(redact.Text(e.err.Error()), e.secrets)
}

func (e *dialError) Unwrap() error { return e.err }
