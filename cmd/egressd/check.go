package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/egressd/egressd/internal/config"
)

// checkReport is `egressd check --format json`'s output.
type checkReport struct {
	OK       bool             `json:"ok"`
	Problems []config.Problem `json:"problems"`
}

func cmdCheck(args []string) int {
	fs, cfgPath, format := newFlags("check", stderr)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	l, err := load(*cfgPath)
	rep := checkReport{OK: err == nil, Problems: []config.Problem{}}
	var verr *config.ValidationError
	switch {
	case errors.As(err, &verr):
		rep.Problems = verr.Problems
	case err != nil:
		rep.Problems = []config.Problem{{Msg: err.Error()}}
	default:
		rep.Problems = append(rep.Problems, l.cfg.Warnings...)
	}
	if *format == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printProblems(rep)
	}
	if !rep.OK {
		return exitUsage
	}
	return exitOK
}

func printProblems(rep checkReport) {
	for _, p := range rep.Problems {
		kind := "error"
		if p.Warning {
			kind = "warning"
		}
		fmt.Printf("%s: %s\n", kind, p.String())
	}
	if rep.OK {
		fmt.Println("ok")
	}
}
