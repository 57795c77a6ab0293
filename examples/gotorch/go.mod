module github.com/pybridge/pybridge/examples/gotorch

go 1.22

require (
	github.com/pybridge/pybridge/examples/mnist v0.0.0
	github.com/pybridge/pybridge/go v0.0.0
)

replace (
	github.com/pybridge/pybridge/examples/mnist => ../mnist
	github.com/pybridge/pybridge/go => ../../go
)
