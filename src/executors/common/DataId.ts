import * as Schema from "effect/Schema"

/**
 * The id a tensor travels under through the sidecar: what an encoder's item, an LLM's embedding
 * reference and a generator's input name in every executor's HTTP API.
 */
export const DataId = Schema.String.pipe(
  Schema.pattern(/^[A-Za-z0-9._:-]{1,128}$/, { message: () => "an id is 1-128 letters, digits or . _ : -" })
)
