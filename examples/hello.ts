/**
 * The smallest app: answers a greeting. Register it with
 *   cornserve app register examples/hello.ts
 * and call it with
 *   cornserve app invoke hello --data '{"name":"Ada"}'
 */
import { Schema } from "effect"
import { defineApp } from "cornserve/app"

const Request = Schema.Struct({
  name: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(200))
})

const Response = Schema.Struct({ greeting: Schema.String })

export default defineApp({
  description: "Greets whoever it is asked to greet.",
  tasks: {},
  request: Request,
  response: Response,
  example: { name: "Ada" },
  serve: ({ name }) => ({ greeting: `Hello, ${name}! Cornserve is serving you.` })
})
