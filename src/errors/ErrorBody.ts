import * as Schema from "effect/Schema"

/** What every executor and route answers on failure: its error's tag and message. */
export const ErrorBody = Schema.Struct({ error: Schema.Struct({ code: Schema.String, message: Schema.String }) })
export type ErrorBody = typeof ErrorBody.Type
