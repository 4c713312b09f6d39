// HTML built from strings with every value escaped: the markup`` tag escapes each interpolated value unless it is
// markup the tag made itself, so a name, a number or a message from the wire is always text, never markup.

/** Escapes a value for HTML text and quoted attributes; null and undefined are empty. */
export const esc = (value) =>
  String(value ?? '').replace(
    /[&<>"']/g,
    (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c],
  );

/** Markup made by markup``: interpolated as is (anything else is escaped). */
class Markup {
  constructor(text) {
    this.text = text;
  }
  toString() {
    return this.text;
  }
}

const part = (v) => (v instanceof Markup ? v.text : Array.isArray(v) ? v.map(part).join('') : esc(v));

/** The tag: markup`<td>${value}</td>` escapes value; nested markup`` results and arrays of them are kept as is. */
export const markup = (strings, ...values) =>
  new Markup(strings.reduce((out, s, i) => out + s + (i < values.length ? part(values[i]) : ''), ''));
