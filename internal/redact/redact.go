// Package redact hides secrets in connection strings, URLs and free text
// before they reach a log line, an error or a terminal.
//
// [DSN] and [URL] redact structurally: they parse the string in the form it
// is written (a URL, a libpq keyword/value string, a go-sql-driver DSN, a
// semicolon-separated key=value string, a SQLite path) and mask each
// password and every parameter whose name says it is a secret. A string
// they cannot parse with certainty is reduced to its scheme and host, or to
// [Redacted]; they never return their input unexamined. [Text] is a
// pattern-based backstop for free text (error messages, log lines) and
// [Secrets] lists the secret values of a DSN so a caller can also scrub
// their literal occurrences.
package redact

import (
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Mask replaces a secret value.
const Mask = "xxxxx"

// Redacted replaces a whole string whose form is not known.
const Redacted = "<redacted>"

var (
	schemeURLRE = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*)://`)
	// hostRE: what may be printed as the host of an unparseable URL.
	hostRE = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]*)(:[0-9]{1,5})?$`)
	// netAddrRE: the start of a go-sql-driver "net(addr)".
	netAddrRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*\(`)
	// keywordRE: the start of a key=value connection string.
	keywordRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*[ \t]*=`)
	// semicolonKeyRE: a key of a semicolon-separated connection string.
	semicolonKeyRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9 _.-]*$`)
	// plainPathRE: a file path (a SQLite database) with nothing secret in
	// it: no '@', '=', '?', ';' or ':' (other than a drive letter).
	plainPathRE = regexp.MustCompile(`^([A-Za-z]:)?[^@=?;:\x00-\x1f]+$`)
)

// secretWords: a parameter whose name (lower case, without '_', '-', '.')
// contains one of these is a secret.
var secretWords = []string{"pass", "pwd", "secret", "token", "apikey", "accesskey", "privatekey", "authkey", "credential", "signature"}

// SecretKey reports whether a parameter or keyword named k holds a secret:
// password, sslpassword, pwd, passfile, access_token, token, secret,
// api_key, key, auth, sig, … Matching is case-insensitive and ignores
// '_', '-' and '.'; it errs on the side of hiding.
func SecretKey(k string) bool {
	n := strings.Map(func(r rune) rune {
		switch r {
		case '_', '-', '.', ' ':
			return -1
		}
		return r
	}, strings.ToLower(k))
	switch n {
	case "key", "auth", "sig", "pw", "pass", "cred", "creds":
		return true
	}
	for _, w := range secretWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// collector gathers the secret values a parse meets.
type collector []string

func (c *collector) add(raw string) {
	if raw == "" {
		return
	}
	*c = append(*c, raw)
	if dec, err := url.QueryUnescape(raw); err == nil && dec != raw && dec != "" {
		*c = append(*c, dec)
	}
	if len(raw) >= 2 && (raw[0] == '\'' || raw[0] == '"') {
		*c = append(*c, raw[1:len(raw)-1])
	}
}

// URL returns an AMQP (or any scheme://) URL with its password and secret
// query parameters masked and its fragment dropped. A URL that does not
// parse unambiguously prints as scheme://host only; a string that is not a
// scheme:// URL prints as [Redacted].
func URL(raw string) string {
	var c collector
	return urlOf(strings.TrimSpace(raw), &c)
}

// DSN returns a database connection string with every secret masked. It
// knows URL DSNs (postgres://, mysql://, …, secret query parameters such as
// password, sslpassword, access_token, token, secret, key included),
// libpq keyword/value strings (quoted values and backslash escapes
// included), go-sql-driver DSNs (user:password@tcp(host:3306)/db?params,
// with or without a mysql:// scheme), semicolon-separated key=value strings,
// file:/sqlite: forms and plain file paths. Anything else prints as
// scheme://host, or as [Redacted].
func DSN(raw string) string {
	var c collector
	return dsnOf(raw, &c)
}

// Secrets returns the secret values DSN finds in raw (raw, unquoted and
// percent-decoded spellings), for scrubbing their literal occurrences from
// text [DSN] never saw (a driver's error message). A value the redacted
// DSN shows anyway (a password equal to the user name) is left out:
// scrubbing it would mangle every word it appears in and hide nothing.
func Secrets(raw string) []string {
	var c collector
	red := dsnOf(raw, &c)
	seen := map[string]bool{}
	out := c[:0]
	for _, s := range c {
		if s != "" && s != Mask && !seen[s] && !strings.Contains(red, s) {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func dsnOf(raw string, c *collector) string {
	s := strings.TrimSpace(raw)
	if s == "" {
		return ""
	}
	if m := schemeURLRE.FindStringSubmatch(s); m != nil {
		switch strings.ToLower(m[1]) {
		case "mysql", "mariadb":
			if out, ok := driverDSN(s[len(m[0]):], c); ok {
				return m[0] + out
			}
		}
		return urlOf(s, c)
	}
	lower := strings.ToLower(s)
	for _, p := range []string{"file:", "sqlite:", "sqlite3:"} {
		if strings.HasPrefix(lower, p) {
			path, q, hasQ := strings.Cut(s, "?")
			if strings.ContainsAny(path, "@;") || strings.Contains(path, "://") {
				return s[:len(p)] + Redacted
			}
			if hasQ {
				return path + "?" + params(q, c)
			}
			return path
		}
	}
	if keywordRE.MatchString(s) {
		if strings.Contains(s, ";") {
			return semicolonDSN(s, c)
		}
		return keywordDSN(s, c)
	}
	if out, ok := driverDSN(s, c); ok {
		return out
	}
	if plainPathRE.MatchString(s) {
		return s
	}
	c.add(s) // the whole string may be a secret
	return Redacted
}

// urlOf redacts a scheme:// URL.
func urlOf(s string, c *collector) string {
	m := schemeURLRE.FindStringSubmatch(s)
	if m == nil {
		c.add(s)
		return Redacted
	}
	u, err := url.Parse(s)
	// An '@' that the parser did not take as the end of the userinfo
	// means the authority is not what it seems ("u:12/3@h": the password
	// ended up in the path): print the host only.
	ambiguous := err != nil || u.Opaque != "" || (u.User == nil && strings.Contains(s, "@"))
	if !ambiguous && u.User != nil {
		head := s[len(m[0]):]
		if i := strings.IndexAny(head, "/?#"); i >= 0 {
			head = head[:i]
		}
		at := strings.LastIndex(head, "@")
		if at < 0 || strings.Contains(s[len(m[0])+at+1:], "@") {
			// Another '@' after the userinfo: a password holding '/',
			// '?' or '#' may run up to it.
			ambiguous = true
		} else if _, pw, ok := strings.Cut(head[:at], ":"); ok {
			c.add(pw)
			if p, ok := u.User.Password(); ok {
				c.add(p)
			}
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
	}
	if ambiguous {
		return hostOnly(m[1], s[len(m[0]):], c)
	}
	if u.RawQuery != "" {
		u.RawQuery = params(u.RawQuery, c)
	}
	u.Fragment, u.RawFragment = "", ""
	out := u.String()
	return strings.Replace(out, ":"+url.QueryEscape(Mask)+"@", ":"+Mask+"@", 1)
}

// hostOnly prints scheme://[xxxxx@]host of an unparseable URL whose text
// after "scheme://" is rest.
func hostOnly(scheme, rest string, c *collector) string {
	out := scheme + "://"
	host := rest
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		c.add(rest[:at])
		if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
			c.add(pw)
		}
		out += Mask + "@"
		host = rest[at+1:]
	}
	if i := strings.IndexAny(host, "/?#"); i >= 0 {
		host = host[:i]
	}
	if !hostRE.MatchString(host) {
		c.add(rest)
		return out + Redacted
	}
	return out + host
}

// params masks the secret values of a query string (pairs separated by
// '&' or ';'), keeping everything else as written.
func params(q string, c *collector) string {
	var b strings.Builder
	for q != "" {
		i := strings.IndexAny(q, "&;")
		part, sep := q, ""
		if i >= 0 {
			part, sep, q = q[:i], q[i:i+1], q[i+1:]
		} else {
			q = ""
		}
		k, v, hasV := strings.Cut(part, "=")
		key := k
		if dec, err := url.QueryUnescape(k); err == nil {
			key = dec
		}
		if SecretKey(key) || !hasV && SecretKey(part) || Text(v) != v {
			c.add(v)
			b.WriteString(k + "=" + Mask)
		} else {
			b.WriteString(part)
		}
		b.WriteString(sep)
	}
	return b.String()
}

// driverDSN redacts a go-sql-driver DSN,
// [user[:password]@][net[(addr)]]/dbname[?params]. ok is false when s is not
// one: no "@net(", "@/" or leading "net(".
func driverDSN(s string, c *collector) (string, bool) {
	at := -1
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '@' && (netAddrRE.MatchString(s[i+1:]) || strings.HasPrefix(s[i+1:], "/")) {
			at = i
			break
		}
	}
	rest := s
	var b strings.Builder
	switch {
	case at >= 0:
		user, pw, hasPW := strings.Cut(s[:at], ":")
		if strings.ContainsAny(user, "@/?=&;#()") || strings.ContainsFunc(user, unicode.IsSpace) {
			return "", false // not a user name: not this form
		}
		b.WriteString(user)
		if hasPW {
			c.add(pw)
			b.WriteString(":" + Mask)
		}
		b.WriteByte('@')
		rest = s[at+1:]
		if strings.Contains(rest, "@") {
			// The driver ends the userinfo at the last '@' before the
			// last '/': the password may run further than it seems.
			if hasPW {
				c.add(s[len(user)+1:])
			}
			return b.String() + Redacted, true
		}
	case !netAddrRE.MatchString(s):
		return "", false
	}
	if netAddrRE.MatchString(rest) {
		end := strings.IndexByte(rest, ')')
		if end < 0 {
			c.add(rest)
			return b.String() + Redacted, true
		}
		b.WriteString(rest[:end+1])
		rest = rest[end+1:]
	}
	path, q, hasQ := strings.Cut(rest, "?")
	if strings.ContainsAny(path, "@=&;") {
		c.add(rest)
		return b.String() + Redacted, true
	}
	b.WriteString(path)
	if hasQ {
		b.WriteString("?" + params(q, c))
	}
	return b.String(), true
}

// keywordDSN redacts a libpq keyword/value string: key = value pairs
// separated by whitespace, a value either single-quoted (with \' and \\
// escapes) or a run of non-space characters (with backslash escapes). What
// follows a syntax error prints as [Redacted].
func keywordDSN(s string, c *collector) string {
	var out []string
	i, n := 0, len(s)
	isSpace := func(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == '\f' || b == '\v' }
	for {
		for i < n && isSpace(s[i]) {
			i++
		}
		if i == n {
			break
		}
		ks := i
		for i < n && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[ks:i]
		for i < n && isSpace(s[i]) {
			i++
		}
		if i == n || s[i] != '=' || !keywordRE.MatchString(key+"=") {
			c.add(s[ks:])
			return strings.Join(append(out, Redacted), " ")
		}
		i++
		for i < n && isSpace(s[i]) {
			i++
		}
		vs := i
		ok := true
		if i < n && s[i] == '\'' {
			i++
			ok = false
			for i < n {
				if s[i] == '\\' && i+1 < n {
					i += 2
					continue
				}
				if s[i] == '\'' {
					i++
					ok = true
					break
				}
				i++
			}
		} else {
			for i < n && !isSpace(s[i]) {
				if s[i] == '\\' && i+1 < n {
					i++
				}
				i++
			}
		}
		if !ok {
			c.add(s[vs:])
			return strings.Join(append(out, key+"="+Mask, Redacted), " ")
		}
		val := s[vs:i]
		// libpq reads "user= password=x" as the user "password=x": a
		// value that looks like it holds a secret is masked as well, and
		// so is one shaped like userinfo ("x:secret@host").
		if SecretKey(key) || Text(val) != val || userinfoLike(val) {
			c.add(val)
			out = append(out, key+"="+Mask)
			continue
		}
		out = append(out, key+"="+val)
	}
	return strings.Join(out, " ")
}

// userinfoLike reports whether v has a ':' before an '@', as
// "user:password@host" has.
func userinfoLike(v string) bool {
	colon := strings.IndexByte(v, ':')
	return colon >= 0 && strings.IndexByte(v[colon:], '@') > 0
}

// semicolonDSN redacts a "Key=Value;Key=Value" string (ADO.NET/ODBC
// style). A quoted or braced value, or a value holding '=', makes the whole
// string [Redacted]: its boundaries are not certain.
func semicolonDSN(s string, c *collector) string {
	parts := strings.Split(s, ";")
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		if strings.TrimSpace(p) == "" {
			out = append(out, p)
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok || !semicolonKeyRE.MatchString(strings.TrimSpace(k)) || strings.ContainsAny(v, "={}\"'") {
			c.add(s)
			return Redacted
		}
		if SecretKey(k) {
			c.add(strings.TrimSpace(v))
			out = append(out, k+"="+Mask)
			continue
		}
		out = append(out, p)
	}
	return strings.Join(out, ";")
}

var (
	// scheme://user:password@ in free text: the password runs to the last
	// '@' of the run of non-space characters.
	textUserinfoRE = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:@/\s"'` + "`" + `]*:)[^\s]*@`)
	// user:password@net( of a go-sql-driver DSN in free text.
	textDriverRE = regexp.MustCompile(`([A-Za-z0-9_.$-]*:)[^\s]*@([A-Za-z][A-Za-z0-9]*\(|/)`)
	// key= (the value is read by valueEnd).
	textKeyRE = regexp.MustCompile(`([A-Za-z0-9_.-]+)[ \t]*=[ \t]*`)
)

// Text hides, in free text, every URL password, go-sql-driver password and
// key=value secret (see [SecretKey]). It is a backstop for messages whose
// structure is unknown (errors of drivers); prefer [DSN] and [URL] where
// the string is known.
func Text(s string) string {
	s = textUserinfoRE.ReplaceAllString(s, "${1}"+Mask+"@")
	s = textDriverRE.ReplaceAllStringFunc(s, func(m string) string {
		sm := textDriverRE.FindStringSubmatch(m)
		if strings.Contains(sm[1], "//") {
			return m
		}
		return sm[1] + Mask + "@" + sm[2]
	})
	var b strings.Builder
	last := 0
	for _, m := range textKeyRE.FindAllStringSubmatchIndex(s, -1) {
		if m[0] < last || !SecretKey(s[m[2]:m[3]]) {
			continue
		}
		end := valueEnd(s, m[1])
		if s[m[1]:end] == Mask {
			continue
		}
		b.WriteString(s[last:m[1]])
		b.WriteString(Mask)
		last = end
	}
	b.WriteString(s[last:])
	return b.String()
}

// valueEnd returns where the value that starts at i ends: after its
// closing quote (single or double, backslash escapes honoured; the end of s
// when unterminated), or at the first space, '&', ';', ',' or quote.
func valueEnd(s string, i int) int {
	if i < len(s) && (s[i] == '\'' || s[i] == '"') {
		q := s[i]
		for j := i + 1; j < len(s); j++ {
			switch s[j] {
			case '\\':
				j++
			case q:
				return j + 1
			}
		}
		return len(s)
	}
	j := i
	for j < len(s) && !strings.ContainsRune(" \t\r\n&;,'\"", rune(s[j])) {
		if s[j] == '\\' {
			j++
		}
		j++
	}
	return min(j, len(s))
}

// Scrub replaces every literal occurrence of each secret in s with [Mask]
// (secrets of fewer than 4 bytes are left alone: masking them would mangle
// the text; the structural redaction still hides them where it knows them).
func Scrub(s string, secrets []string) string {
	const minScrub = 4
	secrets = slices.Clone(secrets)
	// Longest first: a secret that holds another is replaced whole.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, sec := range secrets {
		if len(sec) >= minScrub {
			s = strings.ReplaceAll(s, sec, Mask)
		}
	}
	return s
}
