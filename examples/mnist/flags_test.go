package main

import (
	"strings"
	"testing"
)

// --prox-mu takes the library's rule for FedProx's mu (FedProxGrad's, the Python
// core's): finite and >= 0. +Inf used to pass here and then be ignored per step.
func TestProxMuFlagFollowsFedProxRule(t *testing.T) {
	for _, bad := range []string{"+Inf", "NaN", "-1"} {
		_, err := parseFlags([]string{"-prox-mu", bad})
		if err == nil || !strings.Contains(err.Error(), "FedProx's mu must be a finite number >= 0") {
			t.Errorf("-prox-mu %s: %v", bad, err)
		}
	}
	if o, err := parseFlags([]string{"-prox-mu", "0.5"}); err != nil || o.proxMu != 0.5 {
		t.Errorf("-prox-mu 0.5: %v, %v", o.proxMu, err)
	}
}
