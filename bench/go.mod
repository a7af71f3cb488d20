module github.com/idemq/idemq/bench

go 1.26.0

require (
	github.com/idemq/idemq v0.0.0
	github.com/rabbitmq/amqp091-go v1.17.0
)

require github.com/google/uuid v1.6.0 // indirect

replace github.com/idemq/idemq => ../
