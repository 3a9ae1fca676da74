/**
 * The CLI's client of the platform's own routes, derived from their declaration (`AdminApi.ts`) by
 * `HttpApiClient`: a route's path, payload and answer are the ones the gateway serves. The routes
 * whose answer streams (a registration's events, a recording's, a followed log) and the apps' own
 * routes are called with `fetch` in `client.ts`.
 */
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import type * as HttpApi from "@effect/platform/HttpApi"
import * as HttpApiClient from "@effect/platform/HttpApiClient"
import type { HttpApiDecodeError } from "@effect/platform/HttpApiError"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import * as Effect from "effect/Effect"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { httpStatuses } from "../errors/HttpStatus.js"
import { AdminApi } from "../control/gateway/AdminApi.js"

/** A failed command: its message is printed as is and the process exits non-zero. */
export class CliFailure extends Schema.TaggedError<CliFailure>()("CliFailure", { message: Schema.String }) {}

export interface GatewayTarget {
  readonly url: string
  readonly token: string | undefined
}

/** The client `HttpApiClient` derives from the declaration: a method per route, grouped as the API is. */
type AdminClient = Effect.Effect.Success<
  ReturnType<typeof HttpApiClient.make<"cornserve", AdminApiGroups, HttpApiDecodeError, never>>
>
type AdminApiGroups =
  typeof AdminApi extends HttpApi.HttpApi<"cornserve", infer Groups, infer _E, infer _R> ? Groups : never

const isErrorAnswer = (
  failure: unknown
): failure is { readonly error: { readonly code: keyof typeof httpStatuses; readonly message: string } } =>
  typeof failure === "object" &&
  failure !== null &&
  "error" in failure &&
  typeof failure.error === "object" &&
  failure.error !== null &&
  "code" in failure.error &&
  typeof failure.error.code === "string" &&
  failure.error.code in httpStatuses

/** What the command says of a failed call: the gateway's own error, or why it could not be asked or read. */
const cliFailureOf = (target: GatewayTarget, what: string, failure: unknown): CliFailure => {
  if (isErrorAnswer(failure)) {
    const { code, message } = failure.error
    return new CliFailure({ message: `error ${httpStatuses[code].status}: ${message} (${code})` })
  }
  if (ParseResult.isParseError(failure)) {
    return new CliFailure({
      message: `the gateway's ${what} is not one this client reads: ${ParseResult.TreeFormatter.formatErrorSync(failure)}`
    })
  }
  const error = failure as {
    readonly _tag?: string
    readonly reason?: string
    readonly cause?: unknown
    readonly message?: string
  }
  if (error._tag === "RequestError") {
    const cause =
      error.cause instanceof Error ? (error.cause.cause instanceof Error ? error.cause.cause : error.cause) : undefined
    return new CliFailure({ message: `cannot reach the gateway at ${target.url}: ${cause?.message ?? error.message}` })
  }
  if (error._tag === "ResponseError") {
    return new CliFailure({ message: `the gateway's ${what} is not one this client reads: ${error.message}` })
  }
  return new CliFailure({ message: `the gateway's ${what} failed: ${String(error.message ?? failure)}` })
}

/**
 * Calls the platform's routes through `use`, with the target's token; `what` names the answer in a
 * failure's message. Admin routes take only JSON (a cross-site form cannot reach them): a POST
 * without a body says so too.
 */
export const callAdmin = <A, E>(
  target: GatewayTarget,
  what: string,
  use: (client: AdminClient) => Effect.Effect<A, E>
): Effect.Effect<A, CliFailure> =>
  Effect.gen(function* () {
    const client = yield* HttpApiClient.make(AdminApi, {
      baseUrl: target.url,
      transformClient: HttpClient.mapRequest((request) => {
        const withToken = target.token === undefined ? request : HttpClientRequest.bearerToken(request, target.token)
        return withToken.method === "POST" && withToken.body._tag === "Empty"
          ? HttpClientRequest.setHeader(withToken, "content-type", "application/json")
          : withToken
      })
    })
    return yield* use(client)
  }).pipe(
    Effect.provide(FetchHttpClient.layer),
    Effect.mapError((failure) => cliFailureOf(target, what, failure))
  )
