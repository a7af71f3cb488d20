package redact

import (
	"net/url"
	"regexp"
	"strings"
	"testing"
)

const pw = "S3cr3t!pw"

func TestDSN(t *testing.T) {
	cases := []struct{ in, want string }{
		// URL DSNs.
		{"postgres://app:" + pw + "@db:5432/app?sslmode=disable", "postgres://app:xxxxx@db:5432/app?sslmode=disable"},
		{"postgresql://app@db/app?password=" + pw + "&sslmode=require", "postgresql://app@db/app?password=xxxxx&sslmode=require"},
		{"postgres://db/app?sslpassword=" + pw, "postgres://db/app?sslpassword=xxxxx"},
		{"postgres://db/app?access_token=" + pw + "&application_name=x", "postgres://db/app?access_token=xxxxx&application_name=x"},
		{"postgres://db/app?token=" + pw + ";secret=" + pw + ";key=" + pw, "postgres://db/app?token=xxxxx;secret=xxxxx;key=xxxxx"},
		{"postgres://app:" + url.QueryEscape(pw) + "@db/app", "postgres://app:xxxxx@db/app"},
		{"postgres://app:p@ss" + pw + "@db/app", "postgres://app:xxxxx@db/app"},
		// A password with '/' or '#' that the URL parser misreads: host only.
		{"postgres://app:12/" + pw + "@db/app", "postgres://xxxxx@db"},
		{"postgres://app:" + pw + "#x@db/app", "postgres://xxxxx@db"},
		{"postgres://app:a/b:" + pw + "@db:5432/app", "postgres://xxxxx@db:5432"},
		{"postgres:///app?host=/tmp&password=" + pw, "postgres:///app?host=/tmp&password=xxxxx"},
		{"postgres://app:" + pw + "@db/app#frag", "postgres://app:xxxxx@db/app"},
		// libpq keyword/value.
		{"host=db user=app password=" + pw + " dbname=app", "host=db user=app password=xxxxx dbname=app"},
		{"host=db  password = '" + pw + " with \\' quote' sslmode=require", "host=db password=xxxxx sslmode=require"},
		{"host=db sslpassword=" + pw + " sslkey=/k", "host=db sslpassword=xxxxx sslkey=/k"},
		{"host=db password='" + pw, "host=db password=xxxxx <redacted>"},
		{"host=db user=app " + pw + " password=x", "host=db user=app <redacted>"},
		{"host=db password=" + pw + "\\ more", "host=db password=xxxxx"},
		// go-sql-driver.
		{"app:" + pw + "@tcp(db:3306)/app?parseTime=true", "app:xxxxx@tcp(db:3306)/app?parseTime=true"},
		{"mysql://app:" + pw + "@tcp(db:3306)/app", "mysql://app:xxxxx@tcp(db:3306)/app"},
		{"app:" + pw + "@/app", "app:xxxxx@/app"},
		{"app:p@ss/" + pw + "@unix(/run/mysqld.sock)/app", "app:xxxxx@unix(/run/mysqld.sock)/app"},
		{"tcp(db:3306)/app?password=" + pw, "tcp(db:3306)/app?password=xxxxx"},
		{"mysql://app:" + pw + "@db:3306/app", "mysql://app:xxxxx@db:3306/app"},
		// Semicolon key=value.
		{"Server=db;User Id=app;Password=" + pw + ";", "Server=db;User Id=app;Password=xxxxx;"},
		{"Server=db;Password={" + pw + ";x}", "<redacted>"},
		// SQLite.
		{"file:app.db?_pragma=busy_timeout(1)&_auth_pass=" + pw, "file:app.db?_pragma=busy_timeout(1)&_auth_pass=xxxxx"},
		{"sqlite:///var/lib/app.db", "sqlite:///var/lib/app.db"},
		{"/var/lib/app.db", "/var/lib/app.db"},
		{`C:\data\app.db`, `C:\data\app.db`},
		// Unknown.
		{"app:" + pw, "<redacted>"},
		{"app:" + pw + "@db:3306/app", "<redacted>"},
		{"", ""},
	}
	for _, c := range cases {
		got := DSN(c.in)
		if got != c.want {
			t.Errorf("DSN(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
		if strings.Contains(got, pw) || strings.Contains(got, url.QueryEscape(pw)) {
			t.Errorf("DSN(%q) = %q shows the password", c.in, got)
		}
		for _, s := range Secrets(c.in) {
			if s == "" {
				t.Errorf("Secrets(%q) has an empty secret", c.in)
			}
		}
		if strings.Contains(c.in, pw) {
			if got := Scrub(c.in, Secrets(c.in)); strings.Contains(got, pw) {
				t.Errorf("Scrub(%q, Secrets) = %q shows the password", c.in, got)
			}
		}
	}
}

func TestURL(t *testing.T) {
	cases := []struct{ in, want string }{
		{"amqp://guest:" + pw + "@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"amqps://u:" + pw + "@mq.example:5671/vh?auth_mechanism=external&token=" + pw, "amqps://u:xxxxx@mq.example:5671/vh?auth_mechanism=external&token=xxxxx"},
		{"amqp://guest:guest@localhost", "amqp://guest:xxxxx@localhost"},
		{"amqp://localhost:5672/", "amqp://localhost:5672/"},
		// Malformed: the parse fails or is ambiguous.
		{"amqp://u:" + pw + "@host:notaport/", "amqp://xxxxx@<redacted>"},
		{"amqp://u:ab/" + pw + "@h:5672/", "amqp://xxxxx@h:5672"},
		{"amqp://u:" + pw + " x@h/", "amqp://xxxxx@h"},
		{"u:" + pw + "@h:5672/", "<redacted>"},
	}
	for _, c := range cases {
		if got := URL(c.in); got != c.want {
			t.Errorf("URL(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

func TestText(t *testing.T) {
	cases := []string{
		`dial postgres://app:` + pw + `@db/app: refused`,
		`cannot parse "host=db password='` + pw + `' user=app"`,
		`cannot parse "host=db password=` + pw + ` user=app"`,
		`msg="x" db="app:` + pw + `@tcp(db:3306)/app"`,
		`{"db":"app:` + pw + `@tcp(db:3306)/app"}`,
		`url amqp://u:` + pw + `@h:5672/ bad`,
		`sslpassword=` + pw + `&access_token=` + pw,
	}
	for _, c := range cases {
		if got := Text(c); strings.Contains(got, pw) {
			t.Errorf("Text(%q) = %q shows the password", c, got)
		}
	}
	// What is not a secret stays.
	for _, keep := range []string{`routing_key=orders`, `exchange "" routing key "q"`, `dialect=postgres owner=abc`, `amqp://localhost:5672/`} {
		if got := Text(keep); got != keep {
			t.Errorf("Text(%q) = %q", keep, got)
		}
	}
}

// TestSecretsShownAnywayNotScrubbed: a password equal to the user name is
// shown by the redacted URL anyway; scrubbing it would mangle every word.
func TestSecretsShownAnywayNotScrubbed(t *testing.T) {
	if s := Secrets("amqp://idemq:idemq@h/"); len(s) != 0 {
		t.Fatalf("Secrets = %q", s)
	}
	if got := Scrub("idemq relay starting", Secrets("amqp://idemq:idemq@h/")); got != "idemq relay starting" {
		t.Fatalf("Scrub = %q", got)
	}
	if got := Scrub("auth failed for pw Pl4nted", Secrets("postgres://u:Pl4nted@h/db")); got != "auth failed for pw xxxxx" {
		t.Fatalf("Scrub = %q", got)
	}
}

func TestSecretKey(t *testing.T) {
	for _, k := range []string{"password", "PASSWORD", "sslpassword", "pwd", "passfile", "access_token", "token", "secret", "client_secret", "key", "api-key", "apiKey", "auth", "sig", "_auth_pass", "X-Api-Key"} {
		if !SecretKey(k) {
			t.Errorf("SecretKey(%q) = false", k)
		}
	}
	for _, k := range []string{"host", "user", "dbname", "sslmode", "routing_key", "ordering_key", "application_name", "parseTime", "keepalives"} {
		if SecretKey(k) {
			t.Errorf("SecretKey(%q) = true", k)
		}
	}
}

// planted builds a DSN of one of several forms around a password. The
// fuzzed password is wrapped in '!', a byte no template, user or host
// holds, so any copy of it in the output comes from the password.
func planted(form uint8, user, host, secret string) string {
	strip := func(s string) string { return strings.ReplaceAll(s, "!", "") }
	user, host = strip(user), strip(host)
	p := "!" + secret + "!"
	quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(p) + "'"
	forms := []string{
		"postgres://" + user + ":" + p + "@" + host + "/db?sslmode=disable",
		"postgres://" + user + "@" + host + "/db?password=" + p,
		"postgres://" + host + "/db?sslpassword=" + p + "&x=1",
		"postgres://" + host + "/db?access_token=" + url.QueryEscape(p),
		"host=" + host + " user=" + user + " password=" + p + " dbname=db",
		"host=" + host + " user=" + user + " password=" + quoted + " dbname=db",
		user + ":" + p + "@tcp(" + host + ":3306)/db?parseTime=true",
		"mysql://" + user + ":" + p + "@tcp(" + host + ")/db",
		"mysql://" + user + ":" + p + "@" + host + ":3306/db",
		"Server=" + host + ";User Id=" + user + ";Password=" + p + ";",
		"file:" + host + ".db?_auth_pass=" + p,
		user + ":" + p + "@" + host,
		"postgres://" + user + ":" + url.PathEscape(p) + "@" + host + "/db",
	}
	return forms[int(form)%len(forms)]
}

var plainSecretRE = regexp.MustCompile(`^[A-Za-z0-9._~-]*$`)

func leaks(out, secret string) bool {
	p := "!" + secret + "!"
	for _, s := range []string{p, url.QueryEscape(p), url.PathEscape(p)} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}

func FuzzRedactDSN(f *testing.F) {
	for form := range uint8(13) {
		f.Add(form, "app", "db.example", "S3cr3t")
		f.Add(form, "app", "db", "p@ss/w:rd?#x y'z\\")
		f.Add(form, "", "", "")
		f.Add(form, "u", "h", "@tcp(h)/x")
		f.Add(form, "u", "h", "' user=x")
	}
	f.Fuzz(func(t *testing.T, form uint8, user, host, secret string) {
		in := planted(form, user, host, secret)
		out := DSN(in)
		if leaks(out, secret) {
			t.Fatalf("DSN(%q) = %q shows the password %q", in, out, "!"+secret+"!")
		}
		if got := Text(in); leaks(got, secret) && form%13 < 11 &&
			plainSecretRE.MatchString(secret) && plainSecretRE.MatchString(user) && plainSecretRE.MatchString(host) {
			// Text is a backstop: it must at least catch the forms it
			// knows, for passwords, users and hosts without spaces,
			// quotes or separators.
			t.Fatalf("Text(%q) = %q shows the password", in, got)
		}
		for _, sec := range Secrets(in) {
			if got := Scrub(in, Secrets(in)); len(sec) >= 4 && strings.Contains(got, sec) {
				t.Fatalf("Scrub(%q, Secrets) = %q shows the secret %q", in, got, sec)
			}
		}
	})
}

func FuzzRedactURL(f *testing.F) {
	f.Add("amqp", "guest", "127.0.0.1:5672", "/", "S3cr3t")
	f.Add("amqps", "u", "mq", "/vh?heartbeat=10", "a/b@c")
	f.Add("amqp", "u", "h:bad", "", "x y")
	f.Add("amqp", "", "", "", "")
	f.Fuzz(func(t *testing.T, scheme, user, host, rest, secret string) {
		strip := func(s string) string { return strings.ReplaceAll(s, "!", "") }
		p := "!" + secret + "!"
		for _, in := range []string{
			strip(scheme) + "://" + strip(user) + ":" + p + "@" + strip(host) + strip(rest),
			strip(scheme) + "://" + strip(user) + "@" + strip(host) + "/?token=" + p,
		} {
			if out := URL(in); leaks(out, secret) {
				t.Fatalf("URL(%q) = %q shows the password %q", in, out, p)
			}
		}
	})
}
