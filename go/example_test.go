package pybridge_test

import (
	"errors"
	"fmt"
	"log"
	"strconv"
	"time"

	pybridge "github.com/pybridge/pybridge/go"
)

// singleRank joins a one-rank group on a free loopback port, so that the
// examples run under go test. A real job calls pybridge.Init() with no options
// and lets its launcher (torchrun, pybridge-launch) provide rank and rendezvous.
func singleRank() *pybridge.Group {
	port, err := belowEphemeral() // main_test.go's port picker, as pybridge.base.netif.free_port
	if err != nil {
		log.Fatal(err)
	}
	g, err := pybridge.Init(
		pybridge.WithRank(0),
		pybridge.WithWorldSize(1),
		pybridge.WithInitMethod("tcp://127.0.0.1:"+strconv.Itoa(port)),
		pybridge.WithBackend("gloo"),
		pybridge.WithTimeout(time.Minute),
	)
	if err != nil {
		log.Fatal(err)
	}
	return g
}

func ExampleInit() {
	g := singleRank()
	defer g.Close()
	fmt.Printf("rank %d of %d, local rank %d, device %d\n", g.Rank(), g.Size(), g.LocalRank(), g.Device())
	// Output: rank 0 of 1, local rank 0, device -1
}

func ExampleAllReduce() {
	g := singleRank()
	defer g.Close()
	// Each rank contributes its gradients; afterwards every rank holds the mean.
	grads := []float32{0.5, -1, 2}
	if err := pybridge.AllReduce(g, grads, pybridge.Avg); err != nil {
		log.Fatal(err)
	}
	fmt.Println(grads)
	// Output: [0.5 -1 2]
}

func ExampleBroadcast() {
	g := singleRank()
	defer g.Close()
	// Rank 0's initial weights replace everyone else's.
	weights := make([]float64, 3)
	if g.Rank() == 0 {
		copy(weights, []float64{0.1, 0.2, 0.3})
	}
	if err := pybridge.Broadcast(g, weights, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(weights)
	// Output: [0.1 0.2 0.3]
}

func ExampleAllGather() {
	g := singleRank()
	defer g.Close()
	mine := []int64{int64(g.Rank()), 42}
	all := make([]int64, g.Size()*len(mine))
	if err := pybridge.AllGather(g, mine, all); err != nil {
		log.Fatal(err)
	}
	fmt.Println(all)
	// Output: [0 42]
}

func ExampleReduceScatter() {
	g := singleRank()
	defer g.Close()
	// Every rank sends Size() blocks; rank r gets the reduced block r.
	send := []int32{1, 2, 3, 4}
	recv := make([]int32, len(send)/g.Size())
	if err := pybridge.ReduceScatter(g, send, recv, pybridge.Max); err != nil {
		log.Fatal(err)
	}
	fmt.Println(recv)
	// Output: [1 2 3 4]
}

func ExampleGroup_Barrier() {
	g := singleRank()
	defer g.Close()
	if err := g.Barrier(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("all ranks reached the barrier")
	// Output: all ranks reached the barrier
}

func ExampleAllReduceAsync() {
	g := singleRank()
	defer g.Close()
	// Asynchronous operations use library-owned memory.
	buf, err := pybridge.NewBuffer[float32](4)
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close()
	copy(buf.Data(), []float32{1, 2, 3, 4})
	work, err := pybridge.AllReduceAsync(g, buf, pybridge.Sum)
	if err != nil {
		log.Fatal(err)
	}
	defer work.Close()
	// ... compute something else, not touching buf ...
	if err := work.Wait(0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(buf.Data())
	// Output: [1 2 3 4]
}

func ExampleFloat16FromFloat32() {
	h := pybridge.Float16FromFloat32(0.1)
	b := pybridge.BFloat16FromFloat32(0.1)
	fmt.Printf("%#04x %v\n", uint16(h), h)
	fmt.Printf("%#04x %v\n", uint16(b), b)
	// Output:
	// 0x2e66 0.099975586
	// 0x3dcd 0.100097656
}

func ExampleError() {
	g := singleRank()
	defer g.Close()
	err := pybridge.Broadcast(g, []float32{1}, 5) // there is no rank 5
	var pe *pybridge.Error
	if errors.As(err, &pe) {
		fmt.Println(pe.Op, pybridge.StatusName(pe.Status), errors.Is(err, pybridge.ErrInvalidArgument))
	}
	// Output: Broadcast PB_ERR_INVALID_ARGUMENT true
}

// Local SGD: each rank updates its own parameters; every 4th step after a
// warm-up of 2 the Averager averages them over the group (here one rank).
func ExampleAverager() {
	g := singleRank()
	defer g.Close()
	w := []float32{1, 2}
	avg, err := pybridge.NewAverager[float32](g, 4, pybridge.WithWarmupSteps(2))
	if err != nil {
		log.Fatal(err)
	}
	defer avg.Close()
	for step := 0; step < 7; step++ {
		w[0] -= 0.5 // the optimizer's update
		averaged, err := avg.Step([][]float32{w})
		if err != nil {
			log.Fatal(err)
		}
		if averaged {
			fmt.Println("averaged at step", step)
		}
	}
	// Output:
	// averaged at step 2
	// averaged at step 6
}
