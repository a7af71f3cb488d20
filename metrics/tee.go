package metrics

import "github.com/idemq/idemq"

// Tee returns a recorder that adds to each of recs (an idemq.Counters for
// logs, and a recorder of this package). When one of them is an
// idemq.Observer, the result is one too and passes Settled on to it.
func Tee(recs ...idemq.Recorder) idemq.Recorder {
	t := tee(recs)
	for _, r := range recs {
		if o, ok := r.(idemq.Observer); ok {
			return observingTee{t, o}
		}
	}
	return t
}

type tee []idemq.Recorder

func (t tee) Add(name string, delta int64) {
	for _, r := range t {
		r.Add(name, delta)
	}
}

type observingTee struct {
	tee
	obs idemq.Observer
}

func (t observingTee) Settled(d *idemq.Delivery, s idemq.Settlement) { t.obs.Settled(d, s) }
