package idemqtest_test

import (
	"io"
	"log/slog"
)

var quiet = slog.New(slog.DiscardHandler)

var _ = io.Discard
