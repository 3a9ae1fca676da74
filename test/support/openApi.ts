import SwaggerParser from "@apidevtools/swagger-parser"
import { Ajv2020 } from "ajv/dist/2020.js"

/** Why an OpenAPI document is not valid OpenAPI 3.1 by an independent validator, or undefined when it is. */
export const openApiProblem = async (document: unknown): Promise<string | undefined> => {
  try {
    // The validator dereferences the document in place: it gets a copy.
    await SwaggerParser.validate(structuredClone(document) as never)
    return undefined
  } catch (error) {
    return (error as Error).message
  }
}

/** A parsed OpenAPI document: tests read its fields by path and check them by value. */
// biome-ignore lint/suspicious/noExplicitAny: a document's shape is what the tests check, not what they assume
export type JsonDocument = any

/**
 * Checks `value` against a schema of `document` (whose references point into its
 * `components/schemas`) with Ajv's JSON Schema 2020-12, the dialect of OpenAPI 3.1; answers the
 * errors, or an empty list.
 */
export const schemaErrors = (document: JsonDocument, schema: unknown, value: unknown): Array<string> => {
  const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: true })
  // The document's components ride along in the schema, so that `#/components/schemas/X` resolves.
  const validate = ajv.compile(
    typeof schema === "boolean"
      ? { allOf: [schema], components: document.components }
      : { ...(schema as object), components: document.components }
  )
  return validate(value) ? [] : (validate.errors ?? []).map((error) => `${error.instancePath} ${error.message}`)
}

/** The request schema and example of the operation at `path`'s POST. */
export const requestOf = (
  document: JsonDocument,
  path: string
): { readonly schema: JsonDocument; readonly example: unknown } => {
  const media = document.paths[path].post.requestBody.content["application/json"]
  return { schema: media.schema, example: media.example }
}
