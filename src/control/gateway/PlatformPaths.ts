import * as OpenApiGenerator from "@effect/platform/OpenApi"
import type { PlatformAuth } from "../AppDescriptions.js"
import { AdminApi } from "./AdminApi.js"
import { schemasPrefix } from "./OpenApiParts.js"

/** The document of the platform's own routes, generated from their one declaration (`AdminApi.ts`). */
export const generated = OpenApiGenerator.fromApi(AdminApi)

/**
 * The platform's own routes, generated from their one declaration (`AdminApi.ts`), for whom each
 * wants: without an admin token (or metrics token) its routes show no security and no 401.
 * `HttpApi` adds a 400 for a path or payload it decodes; the gateway decodes neither that way (its
 * bodies are read by its bounded reader, whose refusals each route declares), so that answer goes.
 */
const decodeErrorRef = `${schemasPrefix}HttpApiDecodeError`

type Operation = {
  security?: ReadonlyArray<Record<string, unknown>>
  parameters?: ReadonlyArray<unknown>
  responses: Record<string, { description: string; content?: Record<string, { schema: Record<string, unknown> }> }>
}

const errorCodesOf = (schema: Record<string, unknown>): ReadonlyArray<Record<string, unknown>> =>
  Array.isArray(schema.anyOf) ? (schema.anyOf as ReadonlyArray<Record<string, unknown>>) : [schema]

const platformOperation = (operation: Operation, auth: PlatformAuth): Operation => {
  const schemes = (operation.security ?? []).flatMap((requirement) => Object.keys(requirement))
  const unsecured =
    (schemes.includes("adminToken") && !auth.adminToken) || (schemes.includes("metricsToken") && !auth.metricsToken)
  const responses: Operation["responses"] = {}
  for (const [status, response] of Object.entries(operation.responses)) {
    if (status === "401" && unsecured) continue
    const json = response.content?.["application/json"]
    if (Number(status) < 400 || json === undefined) {
      responses[status] = response
      continue
    }
    const answers = errorCodesOf(json.schema).filter((answer) => answer.$ref !== decodeErrorRef)
    if (answers.length === 0) continue
    const codes = answers.map(
      (answer) =>
        `\`${String(answer.$ref)
          .slice(schemasPrefix.length)
          .replace(/Answer$/, "")}\``
    )
    responses[status] = {
      ...response,
      description: answers.length === 1 ? `An error with code ${codes[0]}.` : `An error: ${codes.join(", ")}.`,
      content: { "application/json": { schema: answers.length === 1 ? answers[0]! : { anyOf: answers } } }
    }
  }
  const { security: _security, parameters, ...rest } = operation
  return {
    ...rest,
    ...(parameters === undefined || parameters.length === 0 ? {} : { parameters }),
    ...(unsecured || schemes.length === 0 ? {} : { security: operation.security! }),
    responses
  }
}

export const platformPaths = (auth: PlatformAuth) =>
  Object.fromEntries(
    Object.entries(generated.paths).map(([path, methods]) => [
      path,
      Object.fromEntries(
        Object.entries(methods as Record<string, Operation>).map(([method, operation]) => [
          method,
          platformOperation(operation, auth)
        ])
      )
    ])
  )
