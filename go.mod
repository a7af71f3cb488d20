module github.com/idemq/idemq

go 1.26.0

require (
	github.com/google/uuid v1.6.0
	github.com/rabbitmq/amqp091-go v1.17.0
	github.com/spf13/cobra v1.10.2
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
)
