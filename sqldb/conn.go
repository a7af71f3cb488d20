package sqldb

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
)

// ConnectionError reports whether err says the database could not be
// reached or the connection to it was lost — not that a statement failed.
// It knows, without importing any driver:
//
//   - network errors: *net.OpError, net.Error, ECONNREFUSED, ECONNRESET,
//     EPIPE, ECONNABORTED, EHOSTUNREACH, ENETUNREACH, io.EOF and
//     io.ErrUnexpectedEOF (the server closed the connection mid-query);
//   - database/sql's driver.ErrBadConn;
//   - errors with a SQLSTATE (a SQLState() string method: pgx's
//     *pgconn.PgError) of class 08 (connection exception), 57P01..57P03
//     (the server is shutting down, crashed, or not accepting connections
//     yet) or 53300 (too many connections);
//   - pgx's connect and closed-connection errors ("failed to connect to",
//     "conn closed") and go-sql-driver/mysql's ErrInvalidConn ("invalid
//     connection"), matched by their text in the error chain.
//
// Constraint violations, syntax errors and every other answer from the
// server are not connection errors. Neither are context.Canceled and
// context.DeadlineExceeded (the caller gave up: that is not an outage).
func ConnectionError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE,
		syscall.ECONNABORTED, syscall.EHOSTUNREACH, syscall.ENETUNREACH} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var sqlState interface{ SQLState() string }
	if errors.As(err, &sqlState) {
		// The server answered: only these codes mean it is going away or
		// cannot take us.
		s := sqlState.SQLState()
		return strings.HasPrefix(s, "08") || s == "57P01" || s == "57P02" || s == "57P03" || s == "53300"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return walk(err, func(e error) bool {
		msg := e.Error()
		return strings.HasPrefix(msg, "failed to connect to") || msg == "conn closed" || msg == "invalid connection"
	})
}

// walk reports whether f holds for err or anything it wraps.
func walk(err error, f func(error) bool) bool {
	for err != nil {
		if f(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if walk(e, f) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// ConfigError reports whether err is a definite configuration error of a
// database connection, one no wait can fix: the server refused the
// credentials or does not know the database or the user (PostgreSQL
// SQLSTATE 28P01, 28000, 3D000; MySQL/MariaDB errors 1044, 1045, 1049,
// 1698), the server's certificate failed verification, or the URL does
// not parse. Everything else — a server that is down, starting, refusing
// connections, full, stalled, or answering in a way nobody listed — is
// not: a process starting waits it out (idemq.WaitFor).
func ConfigError(err error) bool {
	if err == nil {
		return false
	}
	var sqlState interface{ SQLState() string }
	if errors.As(err, &sqlState) {
		switch sqlState.SQLState() {
		case "28P01", "28000", "3D000":
			return true
		}
	}
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	var urlErr *url.Error
	if errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid) || errors.As(err, &verify) {
		return true
	}
	if errors.As(err, &urlErr) && urlErr.Op == "parse" {
		return true
	}
	return walk(err, func(e error) bool {
		// go-sql-driver/mysql's MySQLError reads "Error 1045 (28000): …";
		// pgx's parse errors "cannot parse `…`".
		msg := e.Error()
		for _, code := range []string{"Error 1044 ", "Error 1045 ", "Error 1049 ", "Error 1698 "} {
			if strings.HasPrefix(msg, code) {
				return true
			}
		}
		return strings.HasPrefix(msg, "cannot parse `")
	})
}
