package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/deadletter"
	"github.com/idemq/idemq/internal/display"
	"github.com/idemq/idemq/internal/redact"
)

//go:embed web
var webFS embed.FS

// Cookie names.
const (
	tokenCookie = "idemq_console_token"
	csrfCookie  = "idemq_console_csrf"
	csrfField   = "csrf"
)

// Server is the console's HTTP server.
type Server struct {
	cfg      Config
	log      *slog.Logger
	pages    map[string]*template.Template
	pairs    []queuePair
	byDLQ    map[string]queuePair
	pub      deadletter.Publisher
	closePub func()
	jobs     *jobs
	sampler  *sampler
	handler  http.Handler

	mu     sync.Mutex
	qlocks map[string]*sync.Mutex // per dead-letter queue: one operation at a time
	busy   map[string]string      // dead-letter queue -> running job ID
	ctx    context.Context        // jobs run in it; cancelled by Close
	cancel context.CancelFunc
}

// New builds a server from cfg (defaults applied, then validated).
func New(cfg Config) (*Server, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, byDLQ: map[string]queuePair{}, qlocks: map[string]*sync.Mutex{}, busy: map[string]string{}}
	for _, p := range cfg.Queues {
		if _, dup := s.byDLQ[p.DLQ]; dup {
			continue
		}
		s.pairs = append(s.pairs, p)
		s.byDLQ[p.DLQ] = p
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	s.pages = pages
	s.pub = cfg.Publisher
	if s.pub == nil {
		p, err := idemq.NewPublisher(idemq.PublisherConfig{URL: cfg.AMQPURL, MaxAttempts: 5, Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		s.pub, s.closePub = p, func() { p.Close() }
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.jobs = newJobs()
	s.sampler = newSampler(cfg.AMQPURL, s.pairs, cfg.SampleInterval, cfg.SampleWindow, cfg.Logger)
	s.handler = s.routes()
	return s, nil
}

// Handler is the console's HTTP handler, security included.
func (s *Server) Handler() http.Handler { return s.handler }

// Close stops the sampler and the running jobs, and closes the publisher
// the server made.
func (s *Server) Close() {
	s.cancel()
	s.sampler.stop()
	if s.closePub != nil {
		s.closePub()
	}
}

// Serve serves on ln until ctx is done (then shuts down gracefully). It
// refuses a listener beyond loopback without a token.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if !IsLoopback(ln.Addr().String()) && s.cfg.Token == "" {
		return fmt.Errorf("%w (%s)", ErrTokenRequired, ln.Addr())
	}
	go s.sampler.run(s.ctx)
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("idemq console listening", "addr", ln.Addr().String(), "auth", s.cfg.Token != "", "read_only", s.cfg.ReadOnly,
		"amqp", redact.URL(s.cfg.AMQPURL), "queues", len(s.pairs))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Connections still busy after the grace period (a browser's
		// keep-alive mid-request) are cut.
		s.log.Info("idemq console: connections cut at shutdown", "err", err)
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ListenAndServe listens on Config.Listen and serves until ctx is done.
func (s *Server) ListenAndServe(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("console: listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(webFS, "web/static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", s.overview)
	mux.HandleFunc("GET /dlq", s.dlqPage)
	mux.HandleFunc("GET /dlq/message", s.messagePage)
	mux.HandleFunc("GET /dlq/confirm", s.confirmPage)
	mux.HandleFunc("POST /dlq/act", s.changing(s.act))
	mux.HandleFunc("GET /jobs/{id}", s.jobPage)
	mux.HandleFunc("GET /keys", s.keysPage)
	mux.HandleFunc("POST /keys/forget", s.changing(s.forget))
	mux.HandleFunc("GET /outbox", s.outboxPage)
	mux.HandleFunc("POST /outbox/retry", s.changing(s.outboxRetry))
	mux.HandleFunc("GET /live", s.livePage)
	mux.HandleFunc("GET /api/live", s.liveJSON)
	mux.HandleFunc("POST /login", s.login)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.refuse(w, r, http.StatusForbidden, "cross-origin request refused")
	}))
	return s.secure(cop.Handler(mux))
}

// refuse answers a refused request and logs it.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, why string) {
	s.log.Warn("console request refused", "why", why, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "status", code)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	fmt.Fprintln(w, why)
}

func hashToken(t string) [32]byte { return sha256.Sum256([]byte(t)) }

// tokenOK: the request carries the token (cookie or bearer header).
func (s *Server) tokenOK(r *http.Request) bool {
	want := hashToken(s.cfg.Token)
	if c, err := r.Cookie(tokenCookie); err == nil {
		got := hashToken(c.Value)
		if subtle.ConstantTimeCompare(want[:], got[:]) == 1 {
			return true
		}
	}
	if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		got := hashToken(b)
		return subtle.ConstantTimeCompare(want[:], got[:]) == 1
	}
	return false
}

func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// secure applies the rules every request follows: no DNS rebinding
// without a token, the token when there is one, security headers.
func (s *Server) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("Cache-Control", "no-store")
		if s.cfg.Token == "" {
			if !loopbackHost(r.Host) {
				s.refuse(w, r, http.StatusForbidden, "host "+r.Host+" refused: a console without a token answers loopback names only")
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if r.URL.Path == "/login" || strings.HasPrefix(r.URL.Path, "/static/") {
			next.ServeHTTP(w, r)
			return
		}
		if t := r.URL.Query().Get("token"); t != "" && r.Method == http.MethodGet {
			got, want := hashToken(t), hashToken(s.cfg.Token)
			if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
				s.refuse(w, r, http.StatusUnauthorized, "wrong token")
				return
			}
			s.setTokenCookie(w, r, t)
			q := r.URL.Query()
			q.Del("token")
			u := *r.URL
			u.RawQuery = q.Encode()
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return
		}
		if !s.tokenOK(r) {
			s.log.Warn("console request refused", "why", "no token", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
			w.WriteHeader(http.StatusUnauthorized)
			s.renderStatus(w, r, "login", map[string]any{"Next": r.URL.RequestURI()})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) setTokenCookie(w http.ResponseWriter, r *http.Request, t string) {
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: t, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// login takes the token from a form and sets the cookie.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	got, want := hashToken(r.PostFormValue("token")), hashToken(s.cfg.Token)
	if subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
		s.refuse(w, r, http.StatusUnauthorized, "wrong token")
		return
	}
	s.setTokenCookie(w, r, r.PostFormValue("token"))
	next := r.PostFormValue("next")
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		next = "/"
	}
	s.log.Info("console login", "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// csrfToken returns the request's CSRF token, setting a new cookie when it
// has none.
func (s *Server) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) >= 32 {
		return c.Value
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	v := base64.RawURLEncoding.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return v
}

// changing wraps a state-changing handler: refused in read-only mode and
// without the page's CSRF token.
func (s *Server) changing(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.ReadOnly {
			s.refuse(w, r, http.StatusForbidden, "read-only console: no change allowed")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		sent := r.PostFormValue(csrfField)
		c, err := r.Cookie(csrfCookie)
		if err != nil || sent == "" || len(c.Value) < 32 || subtle.ConstantTimeCompare([]byte(sent), []byte(c.Value)) != 1 {
			s.refuse(w, r, http.StatusForbidden, "CSRF token missing or wrong: reload the page and try again")
			return
		}
		h(w, r)
	}
}

// clean is text fit to render: URLs and DSNs redacted, secrets scrubbed.
func (s *Server) clean(text string) string {
	return redact.Scrub(redact.Text(text), s.cfg.Secrets)
}

func (s *Server) errText(err error) string {
	if err == nil {
		return ""
	}
	return s.clean(err.Error())
}

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	CSRF     string
	ReadOnly bool
	Broker   string
	HasKeys  bool
	HasOut   bool
	Error    string
	Data     any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, name, title string, data any, errMsg string) {
	s.renderCode(w, r, http.StatusOK, name, title, data, errMsg)
}

func (s *Server) renderCode(w http.ResponseWriter, r *http.Request, code int, name, title string, data any, errMsg string) {
	p := page{Title: title, Nav: name, CSRF: s.csrfToken(w, r), ReadOnly: s.cfg.ReadOnly, Broker: redact.URL(s.cfg.AMQPURL),
		HasKeys: s.cfg.Keys != nil, HasOut: s.cfg.Outbox != nil, Error: s.clean(errMsg), Data: data}
	t := s.pages[name]
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if err := t.ExecuteTemplate(w, "layout", p); err != nil {
		s.log.Error("console template", "page", name, "err", err)
	}
}

// renderStatus renders a page that has already had its status written.
func (s *Server) renderStatus(w http.ResponseWriter, r *http.Request, name string, data any) {
	p := page{Title: "Token required", Nav: name, Broker: "", Data: data}
	if err := s.pages[name].ExecuteTemplate(w, "layout", p); err != nil {
		s.log.Error("console template", "page", name, "err", err)
	}
}

// dlqLink is the URL of a DLQ page with extra query parameters.
func dlqLink(path, dlq string, kv ...string) string {
	q := url.Values{"q": {dlq}}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	return path + "?" + q.Encode()
}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"link":      dlqLink,
		"oneLine":   display.OneLine,
		"orDash":    display.OrDash,
		"shortTime": func(s string) string { return display.ShortTime(s, "2006-01-02 15:04:05Z") },
		"pct": func(done, total int64) int64 {
			if total <= 0 {
				return 0
			}
			return min(100, done*100/total)
		},
	}
	names, err := fs.Glob(webFS, "web/*.html")
	if err != nil {
		return nil, err
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "web/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New(base).Funcs(funcs).ParseFS(webFS, "web/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		out[base] = t
	}
	return out, nil
}
