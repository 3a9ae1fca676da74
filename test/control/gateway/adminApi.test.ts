import * as HttpApi from "@effect/platform/HttpApi"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as AST from "effect/SchemaAST"
import { describe, expect, it } from "vitest"
import { AdminApi } from "../../../src/control/gateway/AdminApi.js"
import { platformDocument } from "../../../src/control/gateway/OpenApi.js"
import { type ErrorTag, httpStatuses } from "../../../src/errors/HttpStatus.js"

type Operation = {
  readonly operationId: string
  readonly responses: Record<string, { readonly description: string }>
  readonly security?: ReadonlyArray<unknown>
}

/** The code literal of an error answer's schema (`errorAnswer(tag)`): its `error.code`. */
const codeOf = (ast: AST.AST): string | undefined => {
  if (!AST.isTypeLiteral(ast)) return undefined
  const error = ast.propertySignatures.find((signature) => signature.name === "error")?.type
  if (error === undefined || !AST.isTypeLiteral(error)) return undefined
  const code = error.propertySignatures.find((signature) => signature.name === "code")?.type
  return code !== undefined && AST.isLiteral(code) && typeof code.literal === "string" ? code.literal : undefined
}

/** Each endpoint's declared error tags and their statuses, as `HttpApi.reflect` reads the declaration. */
const declared = () => {
  const endpoints = new Map<string, { readonly tags: Set<string>; readonly statuses: Set<string> }>()
  HttpApi.reflect(AdminApi, {
    onGroup: () => {},
    onEndpoint: ({ endpoint, errors, middleware }) => {
      const tags = new Set<string>()
      const statuses = new Set<string>()
      const add = (ast: AST.AST, status: number) => {
        for (const member of AST.isUnion(ast) ? ast.types : [ast]) {
          // Only error answers (`errorAnswer(tag)`); the decode error HttpApi adds is never answered.
          const code = codeOf(member)
          if (code === undefined) continue
          tags.add(code)
          statuses.add(String(status))
        }
      }
      for (const [status, { ast }] of errors) if (ast._tag === "Some") add(ast.value, status)
      for (const tag of middleware) {
        const failure = (tag as unknown as { readonly failure: { readonly ast: AST.AST } }).failure.ast
        for (const member of AST.isUnion(failure) ? failure.types : [failure])
          add(member, HttpApiSchema.getStatusErrorAST(member))
      }
      endpoints.set(endpoint.name, { tags, statuses })
    }
  })
  return endpoints
}

const operations = (document: ReturnType<typeof platformDocument>): Map<string, Operation> => {
  const found = new Map<string, Operation>()
  for (const methods of Object.values(document.paths as Record<string, Record<string, Operation>>))
    for (const operation of Object.values(methods))
      if (operation.operationId?.includes(".")) found.set(operation.operationId.split(".")[1]!, operation)
  return found
}

const errorStatuses = (operation: Operation) =>
  new Set(Object.keys(operation.responses).filter((status) => Number(status) >= 400))

describe("the admin routes, declared once", () => {
  const endpoints = declared()
  const secured = operations(platformDocument([], { adminToken: true, metricsToken: true }))
  const open = operations(platformDocument([], { adminToken: false, metricsToken: false }))

  it("are every platform route of the document, and only those", () => {
    expect([...secured.keys()].sort()).toEqual([...endpoints.keys()].sort())
    expect(endpoints.size).toBeGreaterThanOrEqual(14)
  })

  it("declare each error's status as the one status table gives it", () => {
    for (const [name, { tags, statuses }] of endpoints) {
      const fromTable = new Set([...tags].map((tag) => String(httpStatuses[tag as ErrorTag].status)))
      expect({ name, statuses: [...statuses].sort() }).toEqual({ name, statuses: [...fromTable].sort() })
    }
  })

  it("document exactly the error statuses their declared errors answer", () => {
    for (const [name, { statuses }] of endpoints) {
      // /health and /ready answer 503 with their usual body, not an error answer.
      const documented = [...errorStatuses(secured.get(name)!)].filter(
        (status) => !(status === "503" && ["health", "ready"].includes(name))
      )
      expect({ name, documented: documented.sort() }).toEqual({
        name,
        documented: [...statuses].sort()
      })
    }
  })

  it("name in each error status's description the codes it may carry", () => {
    for (const [name, { tags }] of endpoints) {
      const operation = secured.get(name)!
      for (const tag of tags) {
        const status = String(httpStatuses[tag as ErrorTag].status)
        expect(operation.responses[status]?.description, `${name} ${status}`).toContain(tag)
      }
    }
  })

  it("leave out the token's 401 and security where the platform has no token", () => {
    for (const [name, operation] of open) {
      expect(operation.security, name).toBeUndefined()
      // A token's 401 goes with the token; an app's API-key 401 (its document) stays.
      const tokenOnly = secured.get(name)!.security !== undefined
      expect(errorStatuses(operation).has("401"), name).toBe(!tokenOnly && errorStatuses(secured.get(name)!).has("401"))
    }
    expect(open.get("appDocument")!.responses["401"]).toBeDefined()
    expect(secured.get("registerApp")!.security).toEqual([{ adminToken: [] }])
    expect(secured.get("metrics")!.security).toEqual([{ metricsToken: [] }])
    expect(secured.get("listApps")!.security).toBeUndefined()
  })
})
