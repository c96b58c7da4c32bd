// The view follows the answer as it grows: until the student scrolls up to read, and again once
// they scroll back to the bottom.

// `follow()` scrolls `messages` to its end (once a frame at most, when the browser lays the
// page out anyway: reading the height after every token would force a layout of its own each
// time); `resume()` follows again whatever the student did (a new question).
export function following(messages) {
  let on = true;
  let pending = false;
  messages.addEventListener(
    "scroll",
    () => {
      on = messages.scrollHeight - messages.scrollTop - messages.clientHeight < 32;
    },
    { passive: true },
  );
  const follow = () => {
    if (!on || pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      if (on) messages.scrollTop = messages.scrollHeight;
    });
  };
  const resume = () => {
    on = true;
    follow();
  };
  return { follow, resume };
}
