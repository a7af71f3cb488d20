package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/display"
	"github.com/idemq/idemq/outbox"
)

// keyView is a dedup record as the keys page shows it.
type keyView struct {
	Group, ID, Key string
	Looked, Found  bool
	State, Owner   string
	Expires, TTL   string
	Live           bool // a processing record with a live lease
	Message        string
}

func viewKey(group, id, key string, rec dedup.Record, found bool) keyView {
	v := keyView{Group: group, ID: id, Key: key, Looked: true, Found: found}
	if found {
		v.State, v.Owner = string(rec.State), rec.Owner
		now := time.Now()
		if !rec.ExpiresAt.IsZero() {
			v.Expires = rec.ExpiresAt.UTC().Format(time.RFC3339)
			v.TTL = rec.TTL(now).Round(time.Second).String()
		}
		v.Live = rec.State == dedup.StateProcessing && rec.TTL(now) > 0
	}
	return v
}

func (s *Server) keyOf(group, id string) (string, error) {
	if group == "" || id == "" {
		return "", errors.New("name the consumer group and the message ID")
	}
	k := dedup.Key(s.cfg.KeyPrefix, group, id)
	return k, dedup.ValidateKey(k)
}

func (s *Server) keysPage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Keys == nil {
		s.refuse(w, r, http.StatusNotFound, "no dedup store configured (--redis)")
		return
	}
	group, id := r.FormValue("group"), r.FormValue("id")
	v := keyView{Group: group, ID: id}
	if group == "" && id == "" {
		s.render(w, r, "keys", "Dedup keys", v, "")
		return
	}
	key, err := s.keyOf(group, id)
	if err != nil {
		s.render(w, r, "keys", "Dedup keys", v, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	rec, found, err := s.cfg.Keys.Get(ctx, key)
	if err != nil {
		s.render(w, r, "keys", "Dedup keys", v, s.errText(err))
		return
	}
	s.render(w, r, "keys", "Dedup keys", viewKey(group, id, key, rec, found), "")
}

func (s *Server) forget(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Keys == nil {
		s.refuse(w, r, http.StatusNotFound, "no dedup store configured (--redis)")
		return
	}
	group, id, force := r.FormValue("group"), r.FormValue("id"), r.FormValue("force") == "yes"
	key, err := s.keyOf(group, id)
	if err != nil {
		s.render(w, r, "keys", "Dedup keys", keyView{Group: group, ID: id}, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	rec, found, err := dedup.ForgetKey(ctx, s.cfg.Keys, key, force)
	v := viewKey(group, id, key, rec, found)
	s.log.Info("console action", "action", "forget", "key", key, "force", force, "found", found, "state", string(rec.State),
		"owner", rec.Owner, "err", s.errText(err), "remote", r.RemoteAddr)
	switch {
	case errors.Is(err, dedup.ErrLeaseHeld):
		s.renderCode(w, r, http.StatusConflict, "keys", "Dedup keys", v, fmt.Sprintf("refused: %s is processing, owner %s, lease expires in %s — a consumer is running this message now; "+
			"deleting its lease would let a duplicate run concurrently. Wait for it, or force.", key, display.OrDash(v.Owner), display.OrDash(v.TTL)))
		return
	case err != nil:
		s.render(w, r, "keys", "Dedup keys", v, s.errText(err))
		return
	}
	if found {
		v.Message = fmt.Sprintf("forgot %s (was %s): the next delivery of %q in group %s is processed again", key, v.State, id, group)
	} else {
		v.Message = fmt.Sprintf("%s had no record: nothing to forget", key)
	}
	v.Found, v.State, v.Owner, v.Expires, v.TTL, v.Live = false, "", "", "", "", false
	s.render(w, r, "keys", "Dedup keys", v, "")
}

// outboxData is the outbox page's.
type outboxData struct {
	Counts          map[outbox.State]int64
	Pending         int64
	Lag             string
	Failed, Waiting []outbox.RowInfo
	Message         string
}

// outboxRows bounds the rows listed per state.
const outboxRows = 100

func (s *Server) outboxPage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Outbox == nil {
		s.refuse(w, r, http.StatusNotFound, "no outbox configured (--db)")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	var d outboxData
	if id := r.FormValue("retried"); id != "" {
		if _, err := strconv.ParseInt(id, 10, 64); err == nil {
			d.Message = "row " + id + " is pending again: the relay publishes it"
		}
	}
	var err error
	if d.Counts, err = s.cfg.Outbox.Count(ctx); err == nil {
		var st outbox.Stats
		if st, err = s.cfg.Outbox.Stats(ctx); err == nil {
			d.Pending, d.Lag = st.Pending, st.Lag.Round(time.Millisecond).String()
			if d.Failed, err = s.cfg.Outbox.List(ctx, outbox.StateFailed, outboxRows); err == nil {
				d.Waiting, err = s.cfg.Outbox.List(ctx, outbox.StatePending, outboxRows)
			}
		}
	}
	s.render(w, r, "outbox", "Outbox", d, s.errText(err))
}

func (s *Server) outboxRetry(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Outbox == nil {
		s.refuse(w, r, http.StatusNotFound, "no outbox configured (--db)")
		return
	}
	id, err := strconv.ParseInt(r.FormValue("id"), 10, 64)
	if err != nil {
		s.refuse(w, r, http.StatusBadRequest, "row id: "+err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	err = s.cfg.Outbox.RetryFailed(ctx, id)
	s.log.Info("console action", "action", "outbox-retry", "row", id, "err", s.errText(err), "remote", r.RemoteAddr)
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, outbox.ErrNotFailed) {
			code = http.StatusConflict
		}
		s.renderCode(w, r, code, "outbox", "Outbox", outboxData{}, s.errText(err))
		return
	}
	http.Redirect(w, r, "/outbox?retried="+strconv.FormatInt(id, 10), http.StatusSeeOther)
}
