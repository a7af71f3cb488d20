package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/privatepg"
)

// TLSServers are a RabbitMQ node, a Redis server and a PostgreSQL cluster
// with TLS listeners, of a test's own, run by scripts/tls.sh on random ports
// with their data and a throwaway CA in a temporary folder. RabbitMQ and
// Redis listen with TLS only; PostgreSQL (ssl=on) also accepts plain text.
type TLSServers struct {
	// CA is the PEM file of the CA that signed the servers' certificate
	// (for localhost and 127.0.0.1); WrongCA is another CA's, which signed
	// nothing here.
	CA, WrongCA string
	// AMQPPort, RedisPort and PostgresPort are the TLS listeners' ports.
	AMQPPort, RedisPort, PostgresPort int
}

// AMQPURL is the node's amqps:// URL trusting ca (its cacertfile
// parameter, which amqp091-go reads).
func (s *TLSServers) AMQPURL(ca string) string {
	return fmt.Sprintf("amqps://guest:guest@localhost:%d/?cacertfile=%s", s.AMQPPort, url.QueryEscape(ca))
}

// RedisURL is the server's rediss:// URL (the CA goes in the client's
// TLSConfig.RootCAs).
func (s *TLSServers) RedisURL() string { return fmt.Sprintf("rediss://localhost:%d/0", s.RedisPort) }

// PostgresURL is database db's URL with sslmode=verify-full trusting ca.
func (s *TLSServers) PostgresURL(db, ca string) string {
	return fmt.Sprintf("postgres://postgres@localhost:%d/%s?sslmode=verify-full&sslrootcert=%s", s.PostgresPort, db, url.QueryEscape(ca))
}

// StartTLS starts the TLS servers (scripts/tls.sh up) and stops them (kill
// -9, data thrown away) at cleanup. Missing servers, openssl or root fail
// the test in CI and skip it elsewhere; servers that do not start fail it.
func StartTLS(t testing.TB) *TLSServers {
	t.Helper()
	for _, b := range []string{"rabbitmq-server", "rabbitmqctl", "redis-server", "redis-cli", "openssl"} {
		if _, err := exec.LookPath(b); err != nil {
			Unavailable(t, b+" (for private TLS servers)", "", err)
		}
	}
	if err := privatepg.Installed(); err != nil {
		Unavailable(t, "PostgreSQL binaries (initdb, for private TLS servers)", "PATH", err)
	}
	if os.Geteuid() != 0 {
		Unavailable(t, "private TLS servers (scripts/tls.sh runs the servers as their own users: root needed)", "", fmt.Errorf("euid %d", os.Geteuid()))
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "idemq-tls-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	name := "idemqt" + hex.EncodeToString(b[:]) + "tls"
	used := map[int]bool{}
	s := &TLSServers{CA: filepath.Join(dir, "certs", "ca.pem"), WrongCA: filepath.Join(dir, "certs", "wrong-ca.pem"),
		AMQPPort: clusterPort(t, used), RedisPort: clusterPort(t, used), PostgresPort: clusterPort(t, used)}
	c := &Cluster{t: t, script: filepath.Join(root, "scripts", "tls.sh"), env: append(os.Environ(),
		"IDEMQ_TLS_DIR="+dir,
		"IDEMQ_TLS_NAME="+name,
		fmt.Sprintf("IDEMQ_TLS_AMQP_PORT=%d", s.AMQPPort),
		fmt.Sprintf("IDEMQ_TLS_DIST_PORT=%d", clusterPort(t, used)),
		fmt.Sprintf("IDEMQ_TLS_REDIS_PORT=%d", s.RedisPort),
		fmt.Sprintf("IDEMQ_TLS_PG_PORT=%d", s.PostgresPort),
	)}
	t.Cleanup(func() {
		start := time.Now()
		if out, err := c.run(2*time.Minute, "down-now"); err != nil {
			t.Logf("scripts/tls.sh down-now: %v\n%s", err, out)
		}
		_ = os.RemoveAll(dir)
		t.Logf("private TLS servers %s stopped in %v", name, time.Since(start).Round(time.Millisecond))
	})
	start := time.Now()
	if out, err := c.run(4*time.Minute, "up"); err != nil {
		t.Fatalf("private TLS servers (scripts/tls.sh up) did not start: %v\n%s", err, tail(out, 40))
	}
	t.Logf("private TLS servers %s up in %v (amqps %d, rediss %d, postgres ssl %d)", name,
		time.Since(start).Round(time.Millisecond), s.AMQPPort, s.RedisPort, s.PostgresPort)
	return s
}
