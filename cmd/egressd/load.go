package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
)

// newFlags returns a flag set with the flags every command shares.
func newFlags(name string, out io.Writer) (*flag.FlagSet, *string, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	cfgPath := fs.String("config", "", "operator config `FILE` (egressd.yaml)")
	format := fs.String("format", "text", "output format: text or json")
	return fs, cfgPath, format
}

// printLoadError prints a load error; validation errors list every problem.
func printLoadError(w io.Writer, err error) {
	var verr *config.ValidationError
	if errors.As(err, &verr) {
		fmt.Fprintln(w, verr.Error())
		return
	}
	fmt.Fprintf(w, "egressd: %v\n", err)
}

var stderr io.Writer = os.Stderr

// colour reports whether console log lines to f may carry ANSI colours: only when f
// is a terminal, and NO_COLOR (no-color.org) is unset. Redirected to a file or a
// pipe, the lines stay plain text.
func colour(f *os.File) bool {
	return os.Getenv("NO_COLOR") == "" && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// newLogger builds the process logger from log.level and log.format.
func newLogger(c config.Log) zerolog.Logger {
	level, err := zerolog.ParseLevel(c.Level)
	if err != nil {
		level = zerolog.InfoLevel
	}
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
	var log zerolog.Logger
	if c.Format == "console" {
		log = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, NoColor: !colour(os.Stderr)})
	} else {
		log = zerolog.New(os.Stdout)
	}
	return log.Level(level).With().Timestamp().Logger()
}
