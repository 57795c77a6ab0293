package pybridge_test

import (
	"context"
	"log"

	pybridge "github.com/pybridge/pybridge/go"
)

// These examples have no Output comment: go test compiles them but does not run
// them, since recording, once on, stays on for the rest of the process (the test
// binary's other tests included). go/observe_test.go runs the same calls on 2 ranks.

// Record a traced run: each rank writes its Chrome trace (chrome://tracing,
// Perfetto), metrics rows and TensorBoard scalars into the directory.
func ExampleStartObserve() {
	if err := pybridge.StartObserve("trace", -1); err != nil { // before Init: clocks aligned there
		log.Fatal(err)
	}
	g, err := pybridge.Init()
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close() // writes trace/rank<R>.trace.json, trace/metrics/rank<R>.jsonl, trace/tensorboard/
	for step := 0; step < 100; step++ {
		sp := pybridge.StartSpanCat("forward", pybridge.CatForward)
		loss := 0.5 // the model's forward pass
		sp.End()
		sp = pybridge.StartSpanCat("backward", pybridge.CatCompute)
		// the backward pass, the reducer's MarkReady and Wait (which ends the step)
		sp.End()
		pybridge.LogScalar("loss", loss)
	}
	pybridge.LogScalar("test_accuracy", 0.97)
	if err := pybridge.FlushObserve(); err != nil { // a bad name or category met on the way
		log.Fatal(err)
	}
}

// A span around a function, for code that passes a context along.
func ExampleWithSpan() {
	err := pybridge.WithSpan(context.Background(), "evaluate", func(ctx context.Context) error {
		return nil // evaluate the model
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Steps ended by the program: from the first StepEnd on, only StepEnd ends steps
// (without it, each Reducer.Wait does).
func ExampleStepEnd() {
	for i := 0; i < 10; i++ {
		// one training step of several reducer iterations (gradient accumulation)
		if _, err := pybridge.StepEnd(); err != nil {
			log.Fatal(err)
		}
	}
}
