package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWithAMQPCA(t *testing.T) {
	env := func(ca string) func(string) string {
		return func(k string) string {
			if k == envAMQPCA {
				return ca
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name, url, ca, want string
	}{
		{"no CA", "amqps://u:p@h:5671/", "", "amqps://u:p@h:5671/"},
		{"plain amqp untouched", "amqp://u:p@h:5672/", "/ca.pem", "amqp://u:p@h:5672/"},
		{"amqps gets cacertfile", "amqps://u:p@h:5671/", "/etc/idemq/ca.pem", "amqps://u:p@h:5671/?cacertfile=%2Fetc%2Fidemq%2Fca.pem"},
		{"other params kept", "amqps://u:p@h:5671/v?heartbeat=5", "/ca.pem", "amqps://u:p@h:5671/v?cacertfile=%2Fca.pem&heartbeat=5"},
		{"URL's own cacertfile wins", "amqps://u:p@h:5671/?cacertfile=/mine.pem", "/ca.pem", "amqps://u:p@h:5671/?cacertfile=/mine.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := withAMQPCA(tc.url, env(tc.ca)); got != tc.want {
				t.Errorf("withAMQPCA(%q) = %q, want %q", tc.url, got, tc.want)
			}
		})
	}
}

func TestRedisOptionsCA(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	caPEM := filepath.Join(dir, "ca.pem")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, url, ca, wantErr string
		wantRoots              bool
	}{
		{"rediss trusts the CA", "rediss://localhost:6380/0", caPEM, "", true},
		{"plain redis ignores the CA", "redis://127.0.0.1:6379/0", notPEM, "", false},
		{"rediss without CA: system roots", "rediss://localhost:6380/0", "", "", false},
		{"missing CA file", "rediss://localhost:6380/0", filepath.Join(dir, "nope.pem"), "IDEMQ_REDIS_CA: read CA certificate", false},
		{"CA file without a certificate", "rediss://localhost:6380/0", notPEM, "no PEM certificate", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envRedisCA, tc.ca)
			opt, err := redisOptions(tc.url)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := opt.TLSConfig != nil && opt.TLSConfig.RootCAs != nil; got != tc.wantRoots {
				t.Errorf("RootCAs set = %v, want %v", got, tc.wantRoots)
			}
		})
	}
}
