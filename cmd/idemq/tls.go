package main

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"os"

	"github.com/redis/go-redis/v9"
)

// Environment variables naming the CA certificate (PEM) that verifies the
// servers' certificates on amqps:// and rediss:// URLs. Unset, the system's
// CAs verify them. Every command resolves its URLs through amqpURL and
// redisOptions, so every command honours them. PostgreSQL needs none: its
// URL carries sslmode=verify-full&sslrootcert=/path/ca.pem (pgx).
const (
	envAMQPCA  = "IDEMQ_AMQP_CA"
	envRedisCA = "IDEMQ_REDIS_CA"
)

// withAMQPCA makes an amqps:// URL trust the CA in IDEMQ_AMQP_CA, through
// amqp091-go's own cacertfile URL parameter (which a URL that already names
// one keeps). Other URLs, and a URL that does not parse (the dial reports it,
// redacted), are returned as they are.
func withAMQPCA(raw string, getenv func(string) string) string {
	ca := getenv(envAMQPCA)
	if ca == "" {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "amqps" {
		return raw
	}
	q := u.Query()
	if q.Get("cacertfile") != "" {
		return raw
	}
	q.Set("cacertfile", ca)
	u.RawQuery = q.Encode()
	return u.String()
}

// redisOptions parses a Redis URL (redis.ParseURL: rediss:// turns TLS on,
// verifying the server's certificate and name) and makes a rediss:// URL
// trust the CA in IDEMQ_REDIS_CA instead of the system's. The errors do not
// quote the URL: callers name it redacted.
func redisOptions(raw string) (*redis.Options, error) {
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, err
	}
	ca := os.Getenv(envRedisCA)
	if ca == "" || opt.TLSConfig == nil {
		return opt, nil
	}
	pool, err := loadCA(ca)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envRedisCA, err)
	}
	opt.TLSConfig.RootCAs = pool
	return opt, nil
}

// loadCA reads a PEM file of CA certificates into a pool.
func loadCA(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("read CA certificate: no PEM certificate in %s", path)
	}
	return pool, nil
}
