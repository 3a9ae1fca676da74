/**
 * At most `limit` characters of a text that may quote a client's or an app's value, so that an error
 * never echoes a large value back. In the SDK's folder because an app's process may read only that.
 */
export const shortened = (text: string, limit = 200): string =>
  text.length <= limit ? text : `${text.slice(0, limit)}… (${text.length - limit} more characters)`
